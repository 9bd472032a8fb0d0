"""Bounded templates: what a template may build, and one-line errors for whatever goes wrong rendering it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.tasks.prompting import PromptTemplate
from mmcomp_eval.tasks.index import BUILTIN_PROMPTS

REPO = Path(__file__).resolve().parent.parent
DOC = Document("doc-7", {"id": "doc-7", "word": "knife", "frame": 123_456_789, "long": "ab" * 1_000_000})

#: each would build gigabytes (or loop for hours) without the caps
HOSTILE = {
    "repeat": "{{ 'a' * 10**9 }}",
    "repeat_list_then_join": "{{ (['a' * 1000000] * 1000) | join }}",
    "replace_twice": "{{ ('a' * 1000) | replace('a', 'a' * 1000) | replace('a', 'a' * 1000) }}",
    "power": "{{ 2 ** (10 ** 10) }}",
    "ljust": "{{ 'x'.ljust(10**9) }}",
    "str_join": "{{ ('a' * 1000000).join(['x'] * 1000) }}",
    "to_bytes": "{{ (1).to_bytes(10**9, 'big') | length }}",
    "percent_width": "{{ '%0999999999d' % 1 }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "center": "{{ 'a' | center(10**9) }}",
    "wordwrap": "{{ ('a' * 1000) | wordwrap(1, true, 'x' * 1000000) }}",
    "expandtabs": "{{ ('\\t' * 100000).expandtabs(100000) }}",
    "translate": "{{ ('a' * 100000).translate({97: 'b' * 100000}) }}",
    "format_map": "{{ '{a:>999999999}'.format_map({'a': 1}) }}",
    "batch": "{{ [1] | batch(10**9, 'x') | list | length }}",
    "tilde_doubling": "{% set ns = namespace(s='a' * 1000) %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "print_shared_list": "{% set l = ['a' * 1000000] %}{{ [" + "l, " * 1000 + "] }}",
    "string_of_shared_list": "{% set l = ['a' * 1000000] %}{{ [" + "l, " * 1000 + "] | string | length }}",
    "replace_in_long_field": "{{ doc.long | replace('a', 'a' * 1000) | length }}",
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "macro_recursion": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}xxxxxxxxxx{% endif %}"
                       "{% endmacro %}{{ f(40) }}",
}

CHILD = """
import json, resource, signal, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))   # 1 GiB: a broken cap fails here, not the machine
signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("over 20 s")))
from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.tasks.prompting import PromptTemplate
folder = Path(sys.argv[1])
doc = Document("doc-7", {"id": "doc-7", "long": "a" * 2_000_000})
for path in sorted(folder.glob("*.jinja")):
    signal.alarm(20)
    try:
        PromptTemplate(path).render(doc, [], "")
        outcome = "rendered"
    except UserError as exc:
        outcome = "UserError: " + str(exc)
    except BaseException as exc:
        outcome = type(exc).__name__ + ": " + str(exc)[:200]
    signal.alarm(0)
    print(json.dumps([path.stem, outcome]), flush=True)
"""


@pytest.fixture(scope="module")
def hostile_outcomes(tmp_path_factory) -> dict[str, str]:
    """Render every hostile template in one child process whose address space is capped at 1 GiB."""
    folder = tmp_path_factory.mktemp("hostile")
    for name, source in HOSTILE.items():
        (folder / f"{name}.jinja").write_text(source)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    return dict(json.loads(line) for line in proc.stdout.splitlines())


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_refused_in_one_line(hostile_outcomes, name):
    outcome = hostile_outcomes.get(name, "no outcome (the child process died)")
    assert outcome.startswith("UserError: "), outcome
    assert f"{name}.jinja:1: while rendering document doc-7, " in outcome
    assert "prompt.max_chars" in outcome or "bits" in outcome or "loop iterations and calls" in outcome
    assert "\n" not in outcome


def test_ordinary_template_features_still_work(tmp_path):
    t = tmp_path / "ok.jinja"
    t.write_text("{{ doc.word }} {{ doc.frame }} {{ 'ab' * 3 }} {{ doc.word | center(9) }} {{ '%5d' % 3 }} "
                 "{{ '{:>4}'.format(1) }} {% for i in range(3) %}{{ i ~ '-' }}{% endfor %} {{ [1, 2] | join(',') }} "
                 "{{ 2 ** 10 }} {{ doc.word | replace('k', 'K') }} {{ doc.word.upper().ljust(7) }}|"
                 "{{ doc.word | tojson }} {{ doc.long | truncate(9) }} {{ doc.long | length }}")
    text = PromptTemplate(t).render(DOC, [], "").text
    # a 2,000,000-character field may be shortened or measured, just not printed whole
    assert text == 'knife 123456789 ababab   knife       3    1 0-1-2- 1,2 1024 Knife KNIFE  |"knife" ababab... 2000000'


def test_max_chars_caps_the_rendered_prompt(tmp_path):
    t = tmp_path / "long.jinja"
    t.write_text("{% for s in shots %}{{ s.word }} {% endfor %}{{ doc.word }}")
    shots = [Document(f"s{i}", {"word": "w" * 10}) for i in range(10)]
    assert len(PromptTemplate(t, max_chars=200).render(DOC, shots, "").text) == 115
    with pytest.raises(UserError) as err:
        PromptTemplate(t, max_chars=100).render(DOC, shots, "")
    msg = str(err.value)
    assert msg.startswith(f"{t}: while rendering document doc-7, the output passed 100 characters, the limit "
                          "(prompt.max_chars in the task file")


def test_max_chars_is_a_task_option(tmp_path):
    from mmcomp_eval.config.task_config import DEFAULT_MAX_PROMPT_CHARS, load_task_file

    base = textwrap.dedent("""
        task: t
        dataset: {name: jsonl, options: {files: {test: d.jsonl}}}
        target_field: answer
        prompt: {template: t.jinja%s}
        metrics: [exact_match]
    """)
    (tmp_path / "a.yaml").write_text(base % "")
    assert load_task_file(tmp_path / "a.yaml").prompt.max_chars == DEFAULT_MAX_PROMPT_CHARS == 1_000_000
    (tmp_path / "b.yaml").write_text(base % ", max_chars: 5000")
    assert load_task_file(tmp_path / "b.yaml").prompt.max_chars == 5000
    (tmp_path / "c.yaml").write_text(base % ", max_chars: 0")
    with pytest.raises(UserError, match="prompt.max_chars is 0; expected at least 1"):
        load_task_file(tmp_path / "c.yaml")


@pytest.mark.parametrize("files, fragment", [
    ({"t.jinja": "line one\n{{ 1 / 0 }}"}, "t.jinja:2: while rendering document doc-7, ZeroDivisionError: division by zero"),
    ({"t.jinja": "{% include 'part.jinja' %}", "part.jinja": "ok\n{{ doc.word | int + 'x' }}"},
     "part.jinja:2: while rendering document doc-7, TypeError: unsupported operand"),
    ({"t.jinja": "a\n{% include 'part.jinja' %}", "part.jinja": "x\ny\n{% if %}"},
     "part.jinja:3: template syntax error: Expected an expression, got 'end of statement block' "
     "(included from t.jinja)"),
    ({"t.jinja": "{% include 't.jinja' %}"}, "t.jinja:1: the template includes or calls itself without end"),
    ({"t.jinja": "{% include 'part.jinja' %}", "part.jinja": b"caf\xe9"},
     "part.jinja:1: byte 0xe9 at offset 3 is not UTF-8"),
])
def test_render_errors_name_the_file_and_line(tmp_path, files, fragment):
    for name, body in files.items():
        (tmp_path / name).write_bytes(body if isinstance(body, bytes) else body.encode())
    with pytest.raises(UserError) as err:
        PromptTemplate(tmp_path / "t.jinja").render(DOC, [], "")
    msg = str(err.value)
    assert fragment in msg and "\n" not in msg
    assert msg.startswith(str(tmp_path / fragment.split(":")[0]))


def test_non_utf8_template_itself(tmp_path):
    t = tmp_path / "t.jinja"
    t.write_bytes(b"ok\n\xff")
    with pytest.raises(UserError, match=r"t.jinja:2: byte 0xff at offset 3 is not UTF-8"):
        PromptTemplate(t)


def test_builtin_templates_render_within_the_limits():
    narr = ["pick up knife", "wash knife", "cut onion", "put down knife"]
    doc = Document("v1", {"narrations": narr, "trg_narration": narr[3], "trg_verb": "put_down", "trg_noun": "knife"})
    for path in sorted(BUILTIN_PROMPTS.glob("*.jinja")):
        assert PromptTemplate(path).render(doc, [doc] * 8, "Predict the next narration").text
