"""Media: frames and keyframes of the clips that documents point to.

``video`` decodes video files (PyAV); ``sources`` finds a clip's frames in an
EPIC-KITCHENS-style folder of extracted JPEG frames or video files;
``keyframes`` picks the frame(s) that stand for a clip; ``cache`` keeps
picked keyframes on disk; ``resolver`` turns the evaluator's ``doc_id#clip``
references into images; ``synthetic`` draws EK-100-style frames, videos and
CompAct-like documents for tests and GPU checks. Submodules import PyAV/PIL lazily where they can, so
importing this package stays cheap.
"""

from mmcomp_eval.media.video import MediaError, count_frames, read_frames, sample_frames, sample_uniform_frames

__all__ = ["MediaError", "count_frames", "read_frames", "sample_frames", "sample_uniform_frames"]
