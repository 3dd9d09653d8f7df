"""A vision-language checkpoint served as its language model alone (Gemma 3 4B and up ship as
Gemma3ForConditionalGeneration, Mistral Small 3.1 and later as Mistral3ForConditionalGeneration):
its config nests the LM's under `text_config`, its files nest
the LM's tensors under a prefix, and the vision tower and projector are never run.

Text-only requests through the LM are the wrapper's own outputs for them: transformers runs the
vision parts only for images, which the API refuses. Three layouts of the nesting exist:
- the Hub's files (what `save_pretrained` writes): `language_model.model.layers.0...` and
  `language_model.lm_head`;
- transformers 5's module names (a state dict saved as is, PEFT's adapters):
  `model.language_model.layers.0...`, with `lm_head` at the top;
- no nesting (Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's Hub files): the LM's own names,
  `model.layers.0...` and `lm_head`, beside the vision tower's `visual.`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shard.models.config import ModelConfig
    from shard.weights import Weights

# A causal LM's name prefix -> the same module's prefix in a layout (prefixes end in "." and
# names are matched with one appended, so `lm_head` is matched whole, never `lm_head_x`).
HUB_LAYOUT = {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."}
MODULE_LAYOUT = {"model.": "model.language_model.", "lm_head.": "lm_head."}
PLAIN_LAYOUT = {"model.": "model.", "lm_head.": "lm_head."}
# The parts a text-only server never runs, in either layout.
VISION_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "model.visual.",  # Qwen3.5's
    "visual.",  # Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's Hub files
    # Gemma 4's: the audio tower and both towers' embedders into the LM
    "model.audio_tower.",
    "model.embed_vision.",
    "model.embed_audio.",
    # Llama 4's
    "vision_model.",
    "model.vision_model.",
    # Voxtral's audio encoder (its projector is multi_modal_projector.)
    "audio_tower.",
    # Kimi K2.5's projector (its tower is vision_tower.)
    "mm_projector.",
    "model.mm_projector.",
)


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The LM's config; ValueError when the wrapper's config lacks it."""
    config = raw.get("text_config")
    if not isinstance(config, dict):
        raise ValueError("config.json has no text_config: the language model's config")
    return config


def _rebase(name: str, old: str, new: str) -> str | None:
    """`name` with prefix `old` replaced by `new`; None when it does not start with `old`."""
    dotted = f"{name}."
    return f"{new}{dotted[len(old) :]}"[:-1] if dotted.startswith(old) else None


def nest(name: str, layout: dict[str, str]) -> str:
    """A causal LM's checkpoint name (`model.layers.0.mlp`, `lm_head`) as `layout` nests it."""
    for plain, nested in layout.items():
        if (found := _rebase(name, plain, nested)) is not None:
            return found
    raise ValueError(f"{name!r} is not a language model name")


def unnest(name: str) -> str | None:
    """A nested name in either layout -> the causal LM's name; None outside the LM."""
    for layout in (HUB_LAYOUT, MODULE_LAYOUT):
        for plain, nested in layout.items():
            if (found := _rebase(name, nested, plain)) is not None:
                return found
    return None


def holds(weights: Weights, name: str) -> bool:
    """Whether the checkpoint holds a causal LM's tensor `name`, as it is or nested in either
    layout (for a model file's choice of names, made before the nesting)."""
    nested = (nest(name, layout) for layout in (MODULE_LAYOUT, HUB_LAYOUT))
    return weights.has(name) or any(weights.has(n) for n in nested)


def layout_of(has: Callable[[str], bool]) -> dict[str, str]:
    """Which layout a checkpoint holds (`has`: Weights.has_module)."""
    if has("model.language_model.embed_tokens"):
        return MODULE_LAYOUT
    return PLAIN_LAYOUT if has("model.embed_tokens") else HUB_LAYOUT


def nested_table(
    table: dict[str, tuple[str, ...]], layout: dict[str, str]
) -> dict[str, tuple[str, ...]]:
    return {ours: tuple(nest(n, layout) for n in names) for ours, names in table.items()}


def adapter_module(name: str, layout: dict[str, str]) -> str | None:
    """An adapter's module name (either layout: PEFT names modules as transformers 5 does) ->
    the checkpoint's name for it; None for a vision module, which text never reaches."""
    if name.startswith(VISION_PREFIXES):
        return None
    plain = unnest(name)
    return name if plain is None else nest(plain, layout)


class TextOnly:
    """Mixed in before the language model's class: `class X(TextOnly, LMClass)`."""

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **fields: Any) -> ModelConfig:
        return super().config_from_dict(text_config(raw), **fields)  # type: ignore[misc]

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = super().names_for(weights)  # type: ignore[misc]
        return nested_table(table, layout_of(weights.has_module))

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_modules(VISION_PREFIXES)
        super().__init__(config, weights, attention)  # type: ignore[call-arg]
        self._layout = layout_of(weights.has_module)

    def adapter_module(self, name: str) -> str | None:
        return adapter_module(name, self._layout)
