"""Tiny random image-text-to-text models for the ``hf_vlm`` adapter's tests: Idefics2, Idefics3, LLaVA, LLaVA-NeXT, Qwen2-VL.

Each family gets the chat template its released checkpoint ships, so a tiny
model places images exactly as the real one does; weights are random and
scores mean nothing. torch and transformers are imported inside the builders.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from mmcomp_eval.testing.tiny_models import random_tokenizer

#: the chat templates the released checkpoints ship (chat_template.json), so tiny models place images as they do
VLM_CHAT_TEMPLATES = {
    # HuggingFaceTB/SmolVLM-Instruct; Idefics3-8B-Llama3's differs only in starting with <|begin_of_text|>
    "idefics3": (
        "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
        "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
        "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
        "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"),
    # HuggingFaceM4/idefics2-8b
    "idefics2": (
        "{% for message in messages %}{{message['role'].capitalize()}}"
        "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
        "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
        "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"),
    # llava-hf/llava-1.5-7b-hf: every image of a turn first, then its text
    "llava": (
        "{% for message in messages %}{% if message['role'] != 'system' %}"
        "{{ message['role'].upper() + ': '}}{% endif %}"
        "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
        "{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
        "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
        "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
        "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"),
    # llava-hf/llava-v1.6-mistral-7b-hf
    "llava_next": (
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{ '<<SYS>>\n' + message['content'][0]['text'] + '\n<</SYS>>\n\n' }}"
        "{% elif message['role'] == 'user' %}{{ '[INST] ' }}{# Render all images first #}"
        "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
        "{# Render all text next #}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
        "{{ content['text'] }}{% endfor %}{{' [/INST]' }}{% elif message['role'] == 'assistant' %}"
        "{{ ' ' + message['content'][0]['text'] + '</s> '}}{% else %}"
        "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"),
    # Qwen/Qwen2-VL-7B-Instruct (Qwen2.5-VL's is the same)
    "qwen2_vl": (
        "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
        "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
        "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
        "{% for content in message['content'] %}"
        "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
        "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
        "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
        "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
        "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}
#: the special tokens each family's processor looks up in its tokenizer
VLM_SPECIAL_TOKENS = {
    "idefics3": ("<|im_start|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                 *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))),
    "idefics2": ("<fake_token_around_image>", "<image>", "<end_of_utterance>"),
    "llava": ("<image>",),
    "llava_next": ("<image>",),
    "qwen2_vl": ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                 "<|video_pad|>"),
}
#: every family's language model: 2 layers of width 32 (Llama; Mistral for Idefics2, Qwen2 for Qwen2-VL)
_TINY_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.5)
_TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def random_image_text(family: str, corpus: Sequence[str], seed: int = 0):
    """A random-weight image-text-to-text model and its processor, in memory.

    ``family`` is ``idefics2`` (a perceiver, 4 tokens per image), ``idefics3``
    (SmolVLM's layout: pixel-shuffled SigLIP tiles, 4 tokens per 32-pixel
    tile, image splitting on), ``llava`` (CLIP, 9 tokens per image),
    ``llava_next`` (any-resolution tiles) or ``qwen2_vl`` (M-RoPE, one token
    per 28x28 pixels, 1 to 4 tokens per image). The chat templates are the
    released checkpoints' (:data:`VLM_CHAT_TEMPLATES`).

    Qwen2-VL's processor needs torchvision (transformers builds its video
    processor even for images); without it the processor returned is
    :func:`image_only_qwen2_vl_processor`'s, which runs the same image and
    text code; a folder saved from it loads only where torchvision is installed.
    """
    import torch

    tokenizer, _ = random_tokenizer(corpus, extra_special=VLM_SPECIAL_TOKENS[family])
    if family == "idefics3":
        tokenizer.bos_token = "<|im_start|>"  # as SmolVLM's: the chat template starts with it
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VLM_SPECIAL_TOKENS[family]}
    text = dict(_TINY_TEXT, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    template = VLM_CHAT_TEMPLATES[family]
    builders = {"idefics2": _tiny_idefics2, "idefics3": _tiny_idefics3, "llava": _tiny_llava,
                "llava_next": _tiny_llava_next,
                "qwen2_vl": _tiny_qwen2_vl}
    config_and_class, processor = builders[family](tokenizer, text, ids, template)
    config, model_class = config_and_class
    torch.manual_seed(seed)
    model = model_class(config).eval()
    return model, processor


def save_random_image_text(folder: Path, family: str, corpus: Sequence[str], seed: int = 0) -> Path:
    """:func:`random_image_text` saved as a folder loadable with ``pretrained=folder``.

    Without torchvision, Qwen2-VL's folder is written part by part (tokenizer,
    image processor, chat template, processor class) as the released
    checkpoints have it, less the video processor; loading it then needs torchvision.
    """
    model, processor = random_image_text(family, corpus, seed)
    folder = Path(folder)
    model.save_pretrained(folder)
    if not getattr(processor, "image_only", False):
        processor.save_pretrained(folder)
        return folder
    processor.tokenizer.save_pretrained(folder)
    processor.image_processor.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(processor.chat_template)
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}))
    return folder


def _tiny_idefics2(tokenizer, text, ids, template):
    from transformers import Idefics2Config, Idefics2ForConditionalGeneration, Idefics2ImageProcessor, Idefics2Processor

    # a perceiver resamples each 30-pixel image (9 patches) to 4 latent tokens (vision and perceiver weights
    # spread as widely as the LM's, or images barely change the output); Mistral is Idefics2-8b's LM
    config = Idefics2Config(vision_config=dict(_TINY_VISION, image_size=30, patch_size=10, initializer_range=0.5),
                            perceiver_config=dict(hidden_size=32, resampler_n_latents=4, resampler_depth=1,
                                                  resampler_n_heads=2, resampler_head_dim=8, num_key_value_heads=1,
                                                  initializer_range=0.5),
                            text_config=dict(text, model_type="mistral"), image_token_id=ids["<image>"])
    image_processor = Idefics2ImageProcessor(size={"shortest_edge": 30, "longest_edge": 30}, do_image_splitting=False)
    processor = Idefics2Processor(image_processor, tokenizer, image_seq_len=4, chat_template=template)
    return (config, Idefics2ForConditionalGeneration), processor


def _tiny_idefics3(tokenizer, text, ids, template):
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor

    # 32-pixel tiles of 8-pixel patches, pixel shuffle by 2: 4 tokens per tile; images are resized to a
    # longest edge of 64, so a 64x48 keyframe becomes 2x2 tiles plus the global view
    config = Idefics3Config(vision_config=dict(_TINY_VISION, image_size=32, patch_size=8),
                            text_config=dict(text, model_type="llama"), scale_factor=2,
                            image_token_id=ids["<image>"], pad_token_id=tokenizer.pad_token_id)
    image_processor = Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                             do_image_splitting=True)
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=4, chat_template=template)
    return (config, Idefics3ForConditionalGeneration), processor


def _tiny_llava(tokenizer, text, ids, template):
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    config = LlavaConfig(vision_config=dict(_TINY_VISION, model_type="clip_vision_model", image_size=30, patch_size=10),
                         text_config=dict(text, model_type="llama"), image_token_id=ids["<image>"],
                         vision_feature_layer=-2, vision_feature_select_strategy="default")
    image_processor = CLIPImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30})
    processor = LlavaProcessor(image_processor, tokenizer, patch_size=10, vision_feature_select_strategy="default",
                               num_additional_image_tokens=1, chat_template=template)
    return (config, LlavaForConditionalGeneration), processor


def _tiny_llava_next(tokenizer, text, ids, template):
    from transformers import (LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextImageProcessor,
                              LlavaNextProcessor)

    pinpoints = [[30, 60], [60, 30], [60, 60]]
    config = LlavaNextConfig(vision_config=dict(_TINY_VISION, model_type="clip_vision_model", image_size=30,
                                                patch_size=10),
                             text_config=dict(text, model_type="llama"), image_token_id=ids["<image>"],
                             image_grid_pinpoints=pinpoints, vision_feature_layer=-2,
                             vision_feature_select_strategy="default")
    image_processor = LlavaNextImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30},
                                              image_grid_pinpoints=pinpoints)
    processor = LlavaNextProcessor(image_processor, tokenizer, patch_size=10, vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1, chat_template=template)
    return (config, LlavaNextForConditionalGeneration), processor


def _tiny_qwen2_vl(tokenizer, text, ids, template):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor

    # head size 8: M-RoPE splits its 4 frequencies over time, height and width
    config = Qwen2VLConfig(
        text_config=dict(text, rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=4 * 28 * 28, patch_size=14, merge_size=2)
    try:
        from transformers import Qwen2VLProcessor, Qwen2VLVideoProcessor

        processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                     video_processor=Qwen2VLVideoProcessor(), chat_template=template)
    except ImportError:
        processor = image_only_qwen2_vl_processor(image_processor, tokenizer, template)
    return (config, Qwen2VLForConditionalGeneration), processor


def image_only_qwen2_vl_processor(image_processor, tokenizer, chat_template: str):
    """Qwen2-VL's processor without its video part, for machines without torchvision.

    transformers 5 insists on a video processor (which needs torchvision) even
    when only images are processed; this subclass has the same image and text
    code (``Qwen2VLProcessor.__call__``) and only drops the video attribute.
    """
    from transformers import ProcessorMixin, Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        image_only = True

        def __init__(self, image_processor, tokenizer, chat_template=None):
            self.image_token = "<|image_pad|>"
            self.video_token = "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return ImageOnlyQwen2VLProcessor(image_processor, tokenizer, chat_template)
