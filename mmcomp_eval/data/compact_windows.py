"""CompAct instances from EK-100 clips (paper section 2 and appendix A).

A video's clips, in temporal order and with repeated narrations dropped, are
cut into sliding windows of 4: three context clips and the target. Only
windows whose target noun class also occurs among the context clips are kept,
so that the task tests new verb-noun *combinations* rather than unseen nouns.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from mmcomp_eval.data.ek100 import Clip
from mmcomp_eval.data.vocab import CategoryIndex, singular, lookup_key, normalised, plain_noun, plain_verb

WINDOW = 4
CONTEXT = WINDOW - 1

DROP_MISSING_TEXT = "missing_text"
DROP_MISSING_ID = "missing_narration_id"
DROP_NOUN_NOT_IN_CONTEXT = "target_noun_not_in_context"


@dataclass(frozen=True)
class NormalisedClip:
    clip: Clip
    text: str  # narration with multiword verbs/nouns joined by "_"
    verb: str  # normalised verb, e.g. "pick_up"
    noun: str  # normalised noun, e.g. "chopping_board"


@dataclass
class WindowStats:
    clips_read: int = 0
    duplicate_clips_dropped: int = 0
    windows_considered: int = 0
    dropped: Counter = field(default_factory=Counter)
    kept: int = 0

    def as_dict(self) -> dict:
        return {
            "clips_read": self.clips_read,
            "duplicate_clips_dropped": self.duplicate_clips_dropped,
            "windows_considered": self.windows_considered,
            "windows_dropped": dict(sorted(self.dropped.items())),
            "windows_kept": self.kept,
        }


def normalise_clip(clip: Clip, index: CategoryIndex) -> NormalisedClip | None:
    """Join multiword verbs and nouns with ``_`` (paper A.3.2).

    The annotation's ``verb``/``noun``/``all_nouns`` say which words belong
    together ("pick up chopping board" with verb ``pick-up`` and noun
    ``board:chopping``). Where those cells are empty (rows of the
    reconstructed train file) the class tables are used instead: the longest
    leading phrase that names a verb, and every phrase that names a noun.
    """
    if clip.narration is None:
        return None
    tokens = lookup_key(clip.narration).split()
    verb_plain = plain_verb(clip.verb) if clip.verb else _leading_verb(tokens, index)
    nouns_plain = [plain_noun(n) for n in (clip.all_nouns or ((clip.noun,) if clip.noun else ()))]
    if not nouns_plain:
        nouns_plain = _noun_phrases(tokens, index, clip.noun_class)
    text = _join_phrases(tokens, [verb_plain, *nouns_plain] if verb_plain else nouns_plain)
    noun_plain = plain_noun(clip.noun) if clip.noun else (
        nouns_plain[0] if nouns_plain else plain_noun(index.nouns[clip.noun_class].key))
    verb_plain = verb_plain or plain_verb(index.verbs[clip.verb_class].key)
    return NormalisedClip(clip, text, normalised(verb_plain), normalised(noun_plain))


def _leading_verb(tokens: list[str], index: CategoryIndex) -> str | None:
    for n in range(min(3, len(tokens)), 0, -1):
        phrase = " ".join(tokens[:n])
        if index.verb_class(phrase) is not None:
            return phrase
    return None


def _noun_phrases(tokens: list[str], index: CategoryIndex, noun_class: int) -> list[str]:
    """Noun phrases in the text, the one of the annotated class first."""
    found: list[str] = []
    i = 0
    while i < len(tokens):
        for n in range(min(4, len(tokens) - i), 0, -1):
            phrase = " ".join(tokens[i:i + n])
            if index.noun_class(phrase) is not None:
                found.append(phrase)
                i += n
                break
        else:
            i += 1
    found.sort(key=lambda p: index.noun_class(p) != noun_class)
    return found


def _join_phrases(tokens: list[str], phrases: Iterable[str]) -> str:
    """Replace each multiword phrase, longest first, by its ``_`` form.

    The last word may be a plural of the annotated noun ("oven gloves" for
    ``glove:oven``); the text keeps its own spelling. Phrases of equal length
    keep the order given (verb, then nouns as annotated, main noun first),
    because two of them can overlap: "wipe top of clip top jar" is annotated
    ``top:clip`` and ``jar:top``, and only one of "clip_top jar" / "clip
    top_jar" can be formed. Ordering by a set's iteration instead made the
    build depend on ``PYTHONHASHSEED``.
    """
    words = list(tokens)
    multiword = dict.fromkeys(p for p in phrases if p and " " in p)  # de-duplicated, order kept
    for phrase in sorted(multiword, key=lambda p: -len(p.split())):  # stable: ties keep their order
        parts = phrase.split()
        n = len(parts)
        i = 0
        while i + n <= len(words):
            span = words[i:i + n]
            if span[:-1] == parts[:-1] and (span[-1] == parts[-1] or singular(span[-1]) == parts[-1]):
                words[i:i + n] = ["_".join(span)]
            i += 1
    return " ".join(words)


def order_and_deduplicate(clips: Iterable[Clip], stats: WindowStats) -> dict[str, list[Clip]]:
    """Clips per video in temporal order, each repeat of the previous narration dropped.

    A repeat is "the same narration as the clip just before" (case and
    spacing ignored): EK-100 annotators split long actions into several
    segments with the same text, which would make the target trivially
    predictable from the context.
    """
    by_video: dict[str, list[Clip]] = defaultdict(list)
    for clip in clips:
        by_video[clip.video_id].append(clip)
        stats.clips_read += 1
    ordered: dict[str, list[Clip]] = {}
    for video, vclips in by_video.items():
        vclips.sort(key=lambda c: (c.start_frame, c.stop_frame, c.row))
        kept: list[Clip] = []
        for clip in vclips:
            prev = kept[-1] if kept else None
            if (prev is not None and clip.narration and prev.narration
                    and lookup_key(clip.narration) == lookup_key(prev.narration)):
                stats.duplicate_clips_dropped += 1
                continue
            kept.append(clip)
        ordered[video] = kept
    return ordered


def instance_id(window: list[Clip]) -> str:
    """``P01_01_12-13-14-16``: the video plus the four narration indices."""
    video = window[0].video_id
    suffixes = [c.narration_id[len(video) + 1:] if c.narration_id.startswith(video + "_") else c.narration_id
                for c in window]
    return f"{video}_{'-'.join(suffixes)}"


def build_windows(videos: dict[str, list[Clip]], index: CategoryIndex, stats: WindowStats) -> list[dict]:
    """Every kept window as a JSON-ready instance record."""
    instances: list[dict] = []
    cache: dict[int, NormalisedClip | None] = {}

    def norm(c: Clip) -> NormalisedClip | None:
        key = id(c)
        if key not in cache:
            cache[key] = normalise_clip(c, index)
        return cache[key]

    for video in sorted(videos):
        vclips = videos[video]
        for i in range(len(vclips) - CONTEXT):
            window = vclips[i:i + WINDOW]
            stats.windows_considered += 1
            if any(c.narration is None for c in window):
                stats.dropped[DROP_MISSING_TEXT] += 1
                continue
            if any(c.narration_id is None for c in window):
                stats.dropped[DROP_MISSING_ID] += 1
                continue
            if window[-1].noun_class not in {c.noun_class for c in window[:CONTEXT]}:
                stats.dropped[DROP_NOUN_NOT_IN_CONTEXT] += 1
                continue
            instances.append(_record(window, [norm(c) for c in window]))
            stats.kept += 1
    return instances


def _record(window: list[Clip], norm: list[NormalisedClip]) -> dict:
    target = norm[-1]
    context = norm[:CONTEXT]
    return {
        "id": instance_id(window),
        "video_id": window[0].video_id,
        "participant_id": window[0].participant_id,
        "src": " . ".join(n.text for n in context),
        "src1": context[0].text,
        "src2": context[1].text,
        "src3": context[2].text,
        "trg": target.text,
        "trg_narration": lookup_key(window[-1].narration),
        "narration_ids": [c.narration_id for c in window],
        "narrations": [c.narration for c in window],
        "verbs_raw": [c.verb for c in window],
        "nouns_raw": [c.noun for c in window],
        "verbs": [n.verb for n in norm],
        "nouns": [n.noun for n in norm],
        "verb_classes": [c.verb_class for c in window],
        "noun_classes": [c.noun_class for c in window],
        "start_timestamps": [c.start_timestamp for c in window],
        "stop_timestamps": [c.stop_timestamp for c in window],
        "start_frames": [c.start_frame for c in window],
        "stop_frames": [c.stop_frame for c in window],
        "trg_verb": target.verb,
        "trg_noun": target.noun,
        "trg_verb_class": window[-1].verb_class,
        "trg_noun_class": window[-1].noun_class,
    }
