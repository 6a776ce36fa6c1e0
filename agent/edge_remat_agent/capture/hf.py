"""Hugging Face `transformers` models, with an optional PEFT adapter, named by a model spec.

    hf:MODEL[?config=FILE][&adapter=FILE|DIR][&task=TASK]

MODEL is a model type transformers knows (`gpt2`, `llama`, `qwen2`, `bert`, `vit`, `whisper`,
...), built from that type's default config with random weights (seeded): nothing is
downloaded. Or MODEL is a local checkpoint directory (a `config.json`, and its weights when
they are there: `from_pretrained` on a local path reads no hub). `config` is a JSON file (or an
inline JSON object) of config fields to change, e.g. `{"n_layer": 2, "n_embd": 64}`; its
`architectures` field (transformers' own) picks the head, e.g. `["BertForSequenceClassification"]`.
`adapter` is a PEFT config (an `adapter_config.json` file or inline JSON, e.g.
`{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}`) or a local adapter
directory (its config and weights). `task` names the head and loss when `architectures` does not:
causal-lm, seq2seq-lm, masked-lm, seq-cls, image-cls, speech-seq2seq (default: the first of
these the model type has, in the order speech-seq2seq, image-cls, seq2seq-lm, masked-lm,
causal-lm, seq-cls).

The module returned computes the task's training loss from positional arguments (transformers'
own `labels` loss), and the example batch matches the task: token ids, an attention mask (the
last sequence padded by a quarter, so masks are exercised; a classifier's with the config's
pad_token_id, or not at all where it names none) and labels (a seq2seq LM's: a target of its
own, padded with -100); pixel values and class labels; log-mel features and decoder labels. `example_input_names(module)` names them.

Relative paths are made absolute (`canonical_spec`), because the board rebuilds the model from
the same spec, in another working directory: the files must be there on the board too.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
import warnings
from typing import Any

import torch
from torch import nn

from ..zoo_shapes import HF_BATCH, HF_SEQ
from .errors import CaptureError
from .hf_spec import is_path, parse_spec
from .hf_spec import json_option as _json_option

TASKS = {  # task -> (Auto class, inputs the example batch gives, in order)
    "causal-lm": ("AutoModelForCausalLM", ("input_ids", "attention_mask", "labels")),
    "seq2seq-lm": ("AutoModelForSeq2SeqLM", ("input_ids", "attention_mask", "labels")),
    "masked-lm": ("AutoModelForMaskedLM", ("input_ids", "attention_mask", "labels")),
    "seq-cls": ("AutoModelForSequenceClassification", ("input_ids", "attention_mask", "labels")),
    "image-cls": ("AutoModelForImageClassification", ("pixel_values", "labels")),
    "speech-seq2seq": ("AutoModelForSpeechSeq2Seq", ("input_features", "labels")),
}
# Without `architectures`: the first head the model type has, most specific first (BERT has a
# causal-LM head too, Whisper a decoder-only one; their own training heads come before; BART's
# and mBART's Auto masked-LM class is their seq2seq one, trained on its own labels).
_DEFAULT_ORDER = ("speech-seq2seq", "image-cls", "seq2seq-lm", "masked-lm", "causal-lm",
                  "seq-cls")
# Model types whose positions transformers counts from the 2D padding mask: they get them as
# `position_ids` beside the 4D mask (TrainingLoss).
POSITIONS_FROM_PADDING = frozenset({"opt"})
# Model types that read the 2D padding mask itself, on no branch of its values: BLOOM builds
# its ALiBi positions from it, DeBERTa its own pairwise mask. Handed a 4D mask, neither
# captured ("too many values to unpack", "Attempting to broadcast a dimension").
READS_2D_MASK = frozenset({"bloom", "deberta", "deberta-v2"})
# Encoder-decoders whose sequence classifier reads each sequence at its <eos> tokens, found by
# value (`unique_consecutive`, boolean indexing): shapes no static graph holds. T5's failed
# first on its default config's missing decoder_start_token_id, naming neither cause.
CLASSIFY_AT_EOS = frozenset({"bart", "bigbird_pegasus", "mbart", "mt5", "mvp", "plbart", "t5",
                             "umt5"})
# Encoder-decoders whose seq2seq LM asks about its batch's values on the way (the op a static
# graph cannot hold), in their own words; each failed at capture on `_local_scalar_dense`.
SEQ2SEQ_READS_VALUES = {
    "fsmt": "asks whether its decoder inputs hold any padding (padding_mask.any())",
    "led": "asks whether any token attends globally (is_index_global_attn.any().item())",
    "longt5": "splits the 2D padding mask into local blocks, asking first whether it has any "
              "padding (padding_mask.all())",
    "mvp": "checks that its attention mask is [batch, 1, target, source] for the encoder and "
           "the cross-attention alike, and asks the 2D one whether it has any padding",
    "pegasus_x": "splits the 2D padding mask into local blocks, asking first whether it has "
                 "any padding (padding_mask.all())",
    "prophetnet": "asserts its shifted labels are not negative (torch.all(...).item())",
    "xlm-prophetnet": "asserts its shifted labels are not negative (torch.all(...).item())",
}
# Seq2seq LMs that start the decoder from each target's own last token (the language id),
# not the config's decoder_start_token_id.
STARTS_FROM_LABELS = frozenset({"mbart", "plbart"})
# The attention layer types (the config's `layer_types`) whose masks TrainingLoss builds.
FULL, SLIDING = "full_attention", "sliding_attention"


class TrainingLoss(nn.Module):
    """`model(**dict(zip(input_names, args))).loss`: a transformers model as the executor wants
    it, a module whose positional arguments are the batch and whose result is the loss.

    A 2D padding mask becomes the 4D mask transformers itself would build (`causal`: key j
    visible from query i when j <= i and j is not padding; otherwise: when j is not padding;
    on layers with a sliding window also when j > i - window), boolean for SDPA and 0 / the
    dtype's minimum for eager attention, which adds it to the scores. Layers of more than one
    attention type (Gemma-2's sliding and full) get a dict, one mask per type, as the model
    accepts it. Given a 2D mask, transformers first asks whether the batch has any padding at
    all (`mask.sum() == mask.numel()`) to skip the mask: a branch on tensor values, which no
    static graph holds; a 4D mask is used as it is, in eager PyTorch as in the captured
    graph. An encoder-decoder (`cross_attention`) reads the one mask twice, in its encoder's
    self-attention and its decoder's cross-attention, whose queries are the labels' length:
    it gets the [batch, 1, 1, seq] key mask both broadcast (its decoder masks itself)."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...], causal: bool = True,
                 positions_from_padding: bool = False, task: str | None = None,
                 vocab_size: int | None = None, attention_types: tuple[str, ...] = (FULL,),
                 sliding_window: int | None = None, reads_2d_mask: bool = False,
                 cross_attention: bool = False):
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)
        self.causal = causal
        self.positions_from_padding = positions_from_padding
        self.task = task  # with vocab_size: how the bundled text feeds it (data.batches)
        self.vocab_size = vocab_size
        self.attention_types = tuple(attention_types)
        self.sliding_window = sliding_window
        self.reads_2d_mask = reads_2d_mask
        self.cross_attention = cross_attention

    def forward(self, *args):
        inputs = dict(zip(self.input_names, args))
        mask = inputs.get("attention_mask")
        if mask is not None and mask.dim() == 2 and not self.reads_2d_mask:
            if self.positions_from_padding:  # what the model would count from the 2D mask
                inputs["position_ids"] = padding_positions(mask)
            inputs["attention_mask"] = self._attention_masks(mask)
            if self.cross_attention:
                inputs["decoder_attention_mask"] = self._decoder_mask(inputs["labels"])
        with _uncached_tensor_helpers():
            out = self.model(**inputs)
        return out.loss if hasattr(out, "loss") else out[0]

    def _attention_masks(self, padding: torch.Tensor):
        masks = {}
        for kind in self.attention_types:
            window = self.sliding_window if kind == SLIDING else None
            mask = padding.bool()[:, None, None, :] if self.cross_attention \
                else attention_mask_4d(padding, self.causal, window)
            masks[kind] = self._as_the_model_reads(mask)
        return masks[self.attention_types[0]] if len(masks) == 1 else masks

    def _decoder_mask(self, labels: torch.Tensor) -> torch.Tensor:
        """The decoder's causal mask over every target position, padded ones included, as
        transformers builds it without a decoder_attention_mask: from a mask of ones, whose
        values it then asks about (BART: "reads a tensor's value" at capture)."""
        return self._as_the_model_reads(attention_mask_4d(torch.ones_like(labels), causal=True))

    def _as_the_model_reads(self, mask: torch.Tensor) -> torch.Tensor:
        eager = getattr(self.model.config, "_attn_implementation", None) == "eager"
        return additive_mask(mask, next(self.model.parameters()).dtype) if eager else mask


@contextlib.contextmanager
def _uncached_tensor_helpers():
    """transformers' `compile_compatible_method_lru_cache` (BEiT's relative position index,
    DETR's, SAM's) caches the tensor a helper returns unless torch.compile is tracing: under
    our trace, the tensor one tracing pass made (a fake one) was handed to the next, and
    capture failed on "Unexpected fake buffer _tensor_constant0". The wrapper asks only
    `pytorch_utils.is_torchdynamo_compiling`; answered yes, each call computes its tensor
    afresh, as under torch.compile: the same values, in eager and in the graph."""
    utils = sys.modules.get("transformers.pytorch_utils")
    asks = getattr(utils, "is_torchdynamo_compiling", None)
    if asks is None:
        yield
        return
    utils.is_torchdynamo_compiling = _compiling
    try:
        yield
    finally:
        utils.is_torchdynamo_compiling = asks


def _compiling() -> bool:
    return True


def padding_positions(padding: torch.Tensor) -> torch.Tensor:
    """Each token's position counted over the tokens before it, -1 on padding: OPT's learned
    positions (`OPTLearnedPositionalEmbedding`), which it counts from the 2D mask itself and
    which a 4D mask cannot give it."""
    return (padding.cumsum(dim=1) * padding - 1).long()


def attention_mask_4d(padding: torch.Tensor, causal: bool,
                      window: int | None = None) -> torch.Tensor:
    """[batch, seq] padding mask (1 = token) -> [batch, 1, seq, seq] boolean attention mask;
    `window`: a causal query i sees only keys j > i - window (transformers'
    `sliding_window_overlay`), a bidirectional one keys |i - j| <= window (ModernBERT)."""
    keys = padding.bool()[:, None, None, :]
    seq = padding.shape[1]
    if not causal and window is None:
        return keys.expand(-1, 1, seq, -1)
    visible = torch.ones(seq, seq, dtype=torch.bool, device=padding.device)
    if causal:
        visible = visible.tril()
        if window is not None:
            visible = visible.triu(1 - window)
    else:  # both ways: |i - j| <= window (`sliding_window_bidirectional_overlay`)
        visible = visible.triu(-window).tril(window)
    return visible[None, None] & keys


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as eager attention adds it to the scores: 0 where visible, the dtype's
    minimum elsewhere (transformers' `eager_mask`). Added as booleans, a visible key got +1
    and a hidden one 0: GPT-J saw the tokens after each one."""
    return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device),
                       torch.finfo(dtype).min)


def load_hf(spec: str, batch: int | None = None, image: int | None = None,
            seq: int | None = None, seed: int = 0) -> tuple[nn.Module, tuple]:
    """Build `(module, example_args)` for an hf: spec (weights from `seed` unless a checkpoint
    directory has them)."""
    transformers = _require("transformers", spec)
    batch, seq = batch or HF_BATCH, seq or HF_SEQ
    model_name, options = parse_spec(spec)
    config, task = _config_and_task(transformers, spec, image)
    auto_name, input_names = TASKS[task]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model(transformers, spec, model_name, config, auto_name)
        if "adapter" in options:
            model = _with_adapter(spec, model, options["adapter"])
    model.train()
    if task in ("causal-lm", "masked-lm", "seq-cls", "seq2seq-lm"):
        _check_positions(spec, model, config, seq)
    _check_classifier_padding(transformers, spec, config, task, batch)
    generator = torch.Generator().manual_seed(seed)
    args = _example_batch(spec, task, config, batch, seq, generator)
    causal = _attends_causally(transformers, config, task)
    encoder_decoder = _trains_a_seq2seq_lm(transformers, config, task)
    if encoder_decoder:
        _check_windows_cover(spec, config, seq)
    return TrainingLoss(model, input_names, causal=causal,
                        positions_from_padding=config.model_type in POSITIONS_FROM_PADDING,
                        task=task, vocab_size=getattr(config, "vocab_size", None),
                        reads_2d_mask=config.model_type in READS_2D_MASK,
                        cross_attention=encoder_decoder,
                        **_attention_layout(spec, config, causal)), args


def options_without_effect(spec: str, image: int | None, seq: int | None) -> list[str]:
    """Why each of --image and --seq given has no effect on an hf: model: an image classifier
    reads only --image (its config's image_size), every other task only --seq."""
    if image is None and seq is None:
        return []
    from ..zoo import unread_shape_options
    _, task = _config_and_task(_require("transformers", spec), spec, image)
    reads = "image" if "pixel_values" in TASKS[task][1] else "seq"
    return unread_shape_options(f"{spec} ({task})", reads, image, seq)


def example_input_names(module: nn.Module) -> tuple[str, ...] | None:
    return getattr(module, "input_names", None)


# -- the parts ------------------------------------------------------------------------------

def _config_and_task(transformers, spec: str, image: int | None):
    """The spec's config (with --image as its image_size) and the task it trains."""
    model_name, options = parse_spec(spec)
    overrides = _json_option(spec, options, "config")
    if image is not None:
        overrides.setdefault("image_size", image)  # vision models: the patch grid follows
    # mixture-of-experts layers: transformers' default, torch._grouped_mm, has no CPU kernel
    # for float32 to trace ("Expected inputs of BF16 type"), and its eager loop picks tokens
    # with nonzero(); batched_mm gathers each token's experts' weights, shapes fixed
    overrides.setdefault("experts_implementation", "batched_mm")
    config = _config(transformers, spec, model_name, overrides)
    vision = getattr(config, "vision_config", None)
    if image is not None and vision is not None \
            and "image_size" not in (overrides.get("vision_config") or {}):
        vision.image_size = image  # two towers (CLIP): the image tower reads its own config
    task = _task(spec, config, options.get("task"))
    if task == "seq-cls" and config.model_type in CLASSIFY_AT_EOS:
        raise CaptureError(spec, f"{config.model_type}'s sequence classifier finds each "
                           "sequence's <eos> tokens by value, an output shape no static graph "
                           "holds: edge-remat cannot train it")
    _check_no_layerdrop(spec, config)
    if _trains_a_seq2seq_lm(transformers, config, task):
        _check_seq2seq(spec, config)
    _decoder_for_causal_lm(transformers, spec, config, task, overrides)
    return config, task


def _check_classifier_padding(transformers, spec: str, config, task: str, batch: int) -> None:
    """A decoder's sequence classifier reads each sequence's last token that is not the
    config's pad_token_id; transformers refuses a batch of more than one where the config
    names none (GPT-2's and Llama's do not), so it is said here with its remedies (QA: the
    bare "Cannot handle batch sizes > 1 if no padding token is defined")."""
    if task != "seq-cls" or batch < 2 or getattr(config, "pad_token_id", None) is not None \
            or not _decoder_only(transformers, config):
        return
    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    usual = f" (its eos_token_id, {eos}, is the usual choice)" if isinstance(eos, int) else ""
    raise CaptureError(spec, f"{config.model_type}'s sequence classifier takes each "
                       "sequence's last token that is not the config's pad_token_id, and "
                       "transformers trains a batch of more than one only where the config "
                       f"names one: add \"pad_token_id\" to the config{usual}, as a tokenizer "
                       "that pads would, or give --batch 1")


def _check_no_layerdrop(spec: str, config) -> None:
    """LayerDrop skips each layer when a random draw falls below the rate (`if torch.rand([])
    < layerdrop`), a branch on a tensor's value: M2M-100's and NLLB's default configs (0.05)
    failed at capture on aten._local_scalar_dense, naming neither the field nor the way out."""
    fields = sorted(name for name, value in config.to_dict().items()
                    if name.endswith("layerdrop") and isinstance(value, (int, float))
                    and value > 0)
    if fields:
        raise CaptureError(spec, f"LayerDrop ({', '.join(fields)} > 0) skips layers at random, "
                           "a branch on a tensor's value no static graph holds: set "
                           f"{' and '.join(fields)} 0 in the config")


def _trains_a_seq2seq_lm(transformers, config, task: str) -> bool:
    """Whether the task's head is an encoder-decoder LM: seq2seq-lm's, and BART's, mBART's
    and MVP's masked-LM head, which is that same class (given no decoder mask, BART's decoder
    asked a mask of ones whether it had padding: `hf:bart?task=masked-lm` failed at capture
    on aten._local_scalar_dense)."""
    if task == "seq2seq-lm":
        return True
    head = getattr(transformers, TASKS[task][0])._model_mapping
    seq2seq = transformers.AutoModelForSeq2SeqLM._model_mapping
    kind = type(config)
    return kind in head and kind in seq2seq and head[kind] is seq2seq[kind]


def _check_windows_cover(spec: str, config, seq: int) -> None:
    """An encoder-decoder gets one key mask (its encoder and cross-attention) and a full
    causal one (its decoder), neither with a sliding window: T5Gemma's sliding layers, at a
    window under --seq, trained another model than transformers' (loss 4.895273 wrapped
    against 4.890446 its own, window 8, --seq 16); at a window of --seq or more they agree."""
    windows = [w for w in _values_of(config.to_dict(), "sliding_window")
               if isinstance(w, int) and w < seq]
    if windows:
        window = min(windows)
        raise CaptureError(spec, f"{config.model_type}'s layers attend within a sliding window "
                           f"of {window} tokens, shorter than --seq {seq}, and edge-remat hands "
                           "an encoder-decoder masks without windows: give --seq "
                           f"{window} or less, or a sliding_window of at least {seq}")


def _values_of(fields: dict, name: str) -> list:
    """Every value of the field `name` in a config's dict and the sub-configs in it."""
    found = [fields[name]] if name in fields else []
    for value in fields.values():
        if isinstance(value, dict):
            found += _values_of(value, name)
    return found


def _check_seq2seq(spec: str, config) -> None:
    """An encoder-decoder's LM, refused in one line where it cannot train as transformers
    runs it: the decoder's inputs are the labels shifted right behind the config's
    decoder_start_token_id (T5's default config names none: "AttributeError: 'T5Config'
    object has no attribute 'decoder_start_token_id'" from inside the model)."""
    kind = config.model_type
    if kind in SEQ2SEQ_READS_VALUES:
        raise CaptureError(spec, f"{kind}'s seq2seq LM {SEQ2SEQ_READS_VALUES[kind]}, a branch "
                           "on tensor values no static graph holds: edge-remat cannot train it")
    if kind not in STARTS_FROM_LABELS \
            and getattr(config, "decoder_start_token_id", None) is None:
        raise CaptureError(spec, "the config names no decoder_start_token_id, the token the "
                           "decoder's inputs (the labels shifted right) start with: add it to "
                           "the config (T5's checkpoints use 0, their pad_token_id; BART's 2, "
                           "their eos_token_id)")


def _require(package: str, spec: str):
    try:
        return __import__(package)
    except ImportError:
        raise CaptureError(spec, f"needs the Python package {package!r}: pip install -e "
                           "'.[hf]' (or pip install transformers peft)") from None


def _config(transformers, spec: str, model_name: str, overrides: dict[str, Any]):
    try:
        if is_path(model_name):
            if not os.path.isfile(os.path.join(model_name, "config.json")):
                raise CaptureError(spec, f"{model_name} is not a checkpoint directory (no "
                                   "config.json in it)")
            return transformers.AutoConfig.from_pretrained(model_name, **overrides)
        _check_model_type(transformers, spec, model_name)
        return transformers.AutoConfig.for_model(model_name, **overrides)
    except CaptureError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' own checks of the fields given
        raise CaptureError(spec, f"the config is refused: {_first_line(exc)}") from None


def _check_model_type(transformers, spec: str, model_name: str) -> None:
    """An unknown type, with a few close names: transformers' own message starts a list of all
    of its ~800 types, which an error line can only cut off."""
    known = list(transformers.CONFIG_MAPPING.keys())
    if model_name in known:
        return
    # a model type is lower case; the mapping also holds a class name or two (QA: "close:
    # EvollaModel" for "notamodel")
    close = difflib.get_close_matches(model_name, [k for k in known if k == k.lower()], n=4)
    hint = f"close: {', '.join(close)}; " if close else ""
    raise CaptureError(spec, f"transformers {transformers.__version__} does not know the model "
                       f"type {model_name!r} ({hint}{len(known)} types known): give a model "
                       "type such as gpt2, llama, bert, vit, whisper, or a local checkpoint "
                       "directory")


def _task(spec: str, config, asked: str | None) -> str:
    import transformers
    heads = [task for task in _DEFAULT_ORDER if _has_head(transformers, config, TASKS[task][0])]
    architectures = getattr(config, "architectures", None) or []
    if asked is not None:
        if asked not in TASKS:
            raise CaptureError(spec, f"unknown task {asked!r}; tasks: {', '.join(TASKS)}")
        if asked not in heads and not architectures:
            raise CaptureError(spec, f"model type {config.model_type!r} has no {asked} head; "
                               + _tasks_it_has(transformers, config, heads))
        return asked
    for arch in architectures:
        task = _task_of_class(transformers, arch)
        if task is not None:
            return task
    if heads:
        return heads[0]
    raise CaptureError(spec, f"no training head for model type {config.model_type!r}: "
                       + _tasks_it_has(transformers, config, heads))


def _task_of_class(transformers, class_name: str) -> str | None:
    """The task whose Auto class builds `class_name`, most specific first: T5's and BART's
    ForConditionalGeneration is a seq2seq LM, Whisper's a speech one (told apart by the name's
    suffix, every ForConditionalGeneration was taken for speech)."""
    for task in _DEFAULT_ORDER:
        names = getattr(transformers, TASKS[task][0])._model_mapping._model_mapping.values()
        if any(class_name in ((name,) if isinstance(name, str) else name) for name in names):
            return task
    return None


# transformers' heads for audio encoders (wav2vec2, HuBERT), none a task edge-remat trains
_AUDIO_HEADS = {"CTC": "AutoModelForCTC",
                "audio classification": "AutoModelForAudioClassification"}


def _tasks_it_has(transformers, config, heads: list[str]) -> str:
    """The tasks the model type has a head for; where none, what it is for instead: the
    message listed every task for wav2vec2, none of which it has."""
    if heads:
        return f"its tasks: {', '.join(heads)}"
    audio = [name for name, auto_name in _AUDIO_HEADS.items()
             if _has_head(transformers, config, auto_name)]
    if audio:
        return (f"its heads are for {' and '.join(audio)}, audio tasks edge-remat does not "
                f"train (it trains {', '.join(TASKS)})")
    # (QA: "it has none edge-remat does not train" read garbled)
    return ("transformers has no head for it among the tasks edge-remat trains "
            f"({', '.join(TASKS)})")


def _model(transformers, spec: str, model_name: str, config, auto_name: str) -> nn.Module:
    arch = next(iter(getattr(config, "architectures", None) or []), None)
    cls = getattr(transformers, arch, None) if arch else None
    auto = getattr(transformers, auto_name)
    if cls is None:
        cls = _head_class(auto, config)
    try:
        if is_path(model_name) and _has_weights(model_name):
            return (cls or auto).from_pretrained(model_name, config=config)
        if cls is not None:
            return cls(config)
        return auto.from_config(config)
    except Exception as exc:  # noqa: BLE001 - a bad config or checkpoint, in the library's words
        raise CaptureError(spec, f"cannot build the model: {_first_line(exc)}") from None


def _head_class(auto, config):
    """Where the Auto class maps this config to several model classes (DeiT's image classifier,
    with and without its teacher), the first, as `architectures` would pick it: `from_config`
    itself then iterated the config's `architectures`, None ('NoneType' object is not
    iterable). Otherwise None: `from_config` picks it."""
    found = auto._model_mapping.get(type(config), None)
    return found[0] if isinstance(found, (tuple, list)) else None


def _first_line(exc: BaseException) -> str:
    """`SafetensorError: Error while deserializing header: ...`: the library's own words."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


def _has_weights(folder: str) -> bool:
    return any(name.endswith((".safetensors", ".bin")) for name in os.listdir(folder))


def _with_adapter(spec: str, model: nn.Module, adapter: str) -> nn.Module:
    peft = _require("peft", spec)
    with warnings.catch_warnings():
        # the pinned peft reads transformers' deprecated `is_gradient_checkpointing` itself:
        # a FutureWarning on every adapter capture that no user can act on
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        adapted = _apply_adapter(peft, spec, model, adapter)
    _check_not_prompt_learning(spec, adapted)
    return adapted


def _check_not_prompt_learning(spec: str, model: nn.Module) -> None:
    """Prefix, prompt and p-tuning prepend virtual tokens to the 2D padding mask, which the
    model is handed as a 4D one (TrainingLoss): capture failed on "Number of dimensions of
    tensors must match", which names neither cause nor way out."""
    config = model.peft_config[model.active_adapter]
    if getattr(config, "is_prompt_learning", False):
        raise CaptureError(spec, f"the {config.peft_type.value} adapter prepends virtual "
                           "tokens to the padding mask, and edge-remat hands the model a 4D "
                           "mask it cannot extend: use an adapter on the weights (LORA, IA3)")


def _apply_adapter(peft: Any, spec: str, model: nn.Module, adapter: str) -> nn.Module:
    if not adapter.lstrip().startswith("{") and os.path.isdir(adapter) \
            and _has_weights(adapter):
        return peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
    fields = _json_option(spec, {"adapter": adapter}, "adapter")
    try:
        config = peft.get_peft_config(fields)
        return peft.get_peft_model(model, config)
    except (ValueError, TypeError, KeyError) as exc:
        raise CaptureError(spec, f"cannot apply the adapter: {str(exc).splitlines()[0][:200]}"
                           ) from None


def _check_positions(spec: str, model: nn.Module, config, seq: int) -> None:
    """A sequence longer than a learned position table (GPT-2's `wpe`, BERT's, OPT's with its
    offset of 2) is refused here: traced with fake tensors it captured and planned, then the
    board's first step stopped at "IndexError: index out of range in self". Rotary models
    (Llama, Qwen2) have no table and take any length."""
    limit = getattr(config, "max_position_embeddings", None)
    if not limit or seq <= limit:
        return
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)
              and limit <= m.num_embeddings <= limit + 2
              and m.num_embeddings != getattr(config, "vocab_size", None)]
    if tables:
        field = getattr(config, "attribute_map", {}).get("max_position_embeddings",
                                                         "max_position_embeddings")
        raise CaptureError(spec, f"--seq {seq} is longer than the model's learned positions "
                                 f"({limit}, the config's {field}): give --seq {limit} or "
                                 f"less, or a larger {field} in the config")


def _decoder_for_causal_lm(transformers, spec: str, config, task: str,
                           overrides: dict[str, Any]) -> None:
    """An encoder's causal-LM head (BERT's, RoBERTa's, ELECTRA's) attends causally only on a
    config with `is_decoder` true; transformers' default is false, so it attended both ways,
    each token seeing the ones it predicts, while the wrapper masked causally: not the model
    transformers trains. The task asks for a decoder, so it gets one unless the config
    refuses it."""
    if task != "causal-lm" or not _encoder_decoder_both(transformers, config):
        return
    if overrides.get("is_decoder") is False:
        raise CaptureError(spec, "task causal-lm on an encoder with is_decoder false attends "
                           "both ways, each token seeing the next one it predicts: set "
                           "is_decoder true in the config, or leave it out")
    config.is_decoder = True


def _attends_causally(transformers, config, task: str) -> bool:
    """Whether transformers masks this model's attention causally: a decoder's causal LM and
    sequence classifier; an encoder that can be a decoder (BERT) when its config's
    `is_decoder` says so, whatever the head (BERT's classifier with is_decoder true attended
    causally in transformers, both ways in the wrapper)."""
    if _encoder_decoder_both(transformers, config):
        return bool(getattr(config, "is_decoder", False))
    return task == "causal-lm" or (task == "seq-cls" and _decoder_only(transformers, config))


def _encoder_decoder_both(transformers, config) -> bool:
    """A model type with a masked-LM and a causal-LM head (BERT, RoBERTa, ELECTRA): an encoder
    whose config's `is_decoder` makes it a decoder."""
    return _has_head(transformers, config, "AutoModelForCausalLM") \
        and _has_head(transformers, config, "AutoModelForMaskedLM")


def _has_head(transformers, config, auto_name: str) -> bool:
    return type(config) in getattr(transformers, auto_name)._model_mapping


def _decoder_only(transformers, config) -> bool:
    """A model type with a causal-LM head and no masked-LM one (GPT-2, Llama; not BERT, which
    has both): its sequence classifier attends causally, as transformers runs it (given a
    padding-only mask, a Llama classifier saw the tokens after each one)."""
    return _has_head(transformers, config, "AutoModelForCausalLM") \
        and not _has_head(transformers, config, "AutoModelForMaskedLM")


def _attention_layout(spec: str, config, causal: bool) -> dict[str, Any]:
    """The attention types of the model's layers and its sliding window, as transformers
    masks them: the config's `layer_types`, else every layer of a decoder sliding where the
    config sets a `sliding_window` (Mistral, Mixtral, Phi-3 pick
    `create_sliding_window_causal_mask` so). Without it, Mistral trained on a full causal mask
    and ModernBERT's local layers saw the whole sequence: silently different models."""
    types = getattr(config, "layer_types", None)
    # an encoder slides where its layer_types say so (ModernBERT's local attention)
    window = getattr(config, "sliding_window", None) if causal or types else None
    if not window:
        return {"attention_types": (FULL,), "sliding_window": None}
    kinds = tuple(dict.fromkeys(types)) if types else (SLIDING,)
    other = sorted(set(kinds) - {FULL, SLIDING})
    if other:
        raise CaptureError(spec, f"layers of attention type {', '.join(other)}: edge-remat "
                           "builds full and sliding-window masks only; give a model whose "
                           "config's layer_types are full_attention or sliding_attention")
    return {"attention_types": kinds, "sliding_window": int(window)}


def _example_batch(spec: str, task: str, config, batch: int, seq: int,
                   generator: torch.Generator) -> tuple:
    if task == "image-cls":
        vision = getattr(config, "vision_config", None) or config  # CLIP's image tower
        size = _pair(getattr(vision, "image_size", 224))
        pixels = torch.randn(batch, getattr(vision, "num_channels", 3), *size,
                             generator=generator)
        return pixels, _class_labels(config, batch, generator)
    if task == "speech-seq2seq":
        frames = 2 * getattr(config, "max_source_positions", 1500)  # two convs, stride 2
        features = torch.randn(batch, getattr(config, "num_mel_bins", 80), frames,
                               generator=generator)
        return features, torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        raise CaptureError(spec, "the config has no vocab_size to draw token ids from")
    if task == "seq-cls":
        return (*_padded_tokens(config, vocab, batch, seq, generator),
                _class_labels(config, batch, generator))
    if task == "seq2seq-lm":  # a source and a target of its own, each padded differently
        ids, mask = _padded_tokens(config, vocab, batch, seq, generator)
        labels = torch.randint(0, vocab, (batch, seq), generator=generator)
        labels[-1, seq - seq // 3:] = -100  # as transformers' DataCollatorForSeq2Seq pads
        return ids, mask, labels
    ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq - seq // 4:] = 0  # the last sequence is padded: masks matter
    labels = ids.masked_fill(mask == 0, -100)
    if task == "masked-lm":  # predict 15% of the tokens, as BERT's pre-training does
        chosen = torch.rand(batch, seq, generator=generator) < 0.15
        chosen[:, 0] = True
        labels = labels.masked_fill(~chosen, -100)
    return ids, mask, labels


def _padded_tokens(config, vocab: int, batch: int, seq: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and mask padded as a tokenizer pads them, for a sequence classifier, which
    reads the ids under the padding too (a decoder, GPT-2 or Llama, classifies each sequence
    by its last token that is not the config's pad_token_id), and an encoder-decoder's source.
    The last sequence is padded with that id, and no other token is it; a config that names
    none gets no padding (such a decoder classifies the last token)."""
    pad = getattr(config, "pad_token_id", None)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if pad is None or not 0 <= pad < vocab or vocab < 2:
        return torch.randint(0, vocab, (batch, seq), generator=generator), mask
    ids = torch.randint(0, vocab - 1, (batch, seq), generator=generator)
    ids += (ids >= pad).long()  # every id but pad
    mask[-1, seq - seq // 4:] = 0  # the last sequence is padded: masks matter
    return ids.masked_fill(mask == 0, pad), mask


def _class_labels(config, batch: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, getattr(config, "num_labels", 2), (batch,), generator=generator)


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)
