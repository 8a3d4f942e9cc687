"""Hugging Face transformers models as workloads (``kind: transformers``).

The model is built from its config, never downloaded: ``AutoConfig.for_model(model_type, **config)`` and the
task's ``AutoModelFor...`` class's ``from_config``, with random weights from the harness's seed; or, with ``path``,
a local checkpoint folder loaded with ``local_files_only=True`` (a user's own fine-tuned model). The inputs are
made from the config: token ids in ``[0, vocab_size)`` and an all-ones attention mask for a text model
(``main_input_name`` ``input_ids``; also decoder token ids for an encoder-decoder model), pixel values for a vision
model (``pixel_values``, ``num_channels`` x ``image_size`` squared); in train mode also ``labels`` (the token ids
for a language model, class indices for image classification), so the model computes its own loss (``loss`` of its
output, which :func:`operator_profiler.capture.training.default_loss` takes).

The harness calls every model as ``model(*inputs)``; an HF model takes its inputs by name. So the built model's
class is swapped for a subclass of the same name whose ``forward(*tensors)`` passes them on by name
(:func:`positional_forward`); the module tree, parameter names and module classes stay the HF model's.

Details and the config keys: docs/config.md#hugging-face-transformers.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from typing import Any

import torch
import torch.nn as nn

from ..errors import WorkloadError

#: config ``task`` -> the transformers Auto class that builds it.
TASKS = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
    "base": "AutoModel",
}
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The package extra that installs transformers (pyproject.toml), named by every "not installed" message.
EXTRA = "pip install -e '.[transformers]'"
#: The transformers versions this module is tested with (pyproject.toml's ``transformers`` extra pins one).
TESTED = "5.23.0"


def available() -> bool:
    """Whether the ``transformers`` package can be imported here (found on the path; not imported)."""
    return importlib.util.find_spec("transformers") is not None


def missing_message(where: str) -> str:
    """The one line that says ``transformers`` is not installed, naming the extra that installs it."""
    return (f"{where}: kind transformers needs the transformers package, which is not installed in this Python "
            f"environment; install the project's extra: {EXTRA}")


def library_dir() -> str | None:
    """The transformers package folder (its frames are library code in a user error's traceback), or None."""
    spec = importlib.util.find_spec("transformers")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _import():
    if not available():
        raise WorkloadError(missing_message("workload"))
    # Never reach the hub, whatever the environment says (a local folder is all this module loads).
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    return transformers


def local_folder_problem(path: str) -> str | None:
    """Why ``path`` is not a local checkpoint folder (a hub name is refused: nothing is downloaded), or None."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            return (f"path {path!r} is a folder without config.json, not a saved transformers checkpoint "
                    "(save_pretrained writes config.json and the weights); point path at such a folder")
        return None
    if os.path.exists(path):
        return f"path {path!r} is a file, not a checkpoint folder; point path at the folder save_pretrained wrote"
    return (f"path {path!r} is not a local folder; Operator Profiler never downloads a model (a hub name is "
            "refused): download it yourself (huggingface-cli download NAME --local-dir DIR) and set path: DIR, or "
            "build it from its config with model_type and no path")


def build_config(cfg: dict):
    """The model's ``PretrainedConfig``: the local folder's (``path``) or ``AutoConfig.for_model(model_type)``,
    with the workload's ``config`` overrides; ``use_cache`` off unless the overrides set it (a profiled forward
    never reads the cache it would build). Raises WorkloadError: unknown model type, bad override, bad path."""
    transformers = _import()
    overrides = dict(cfg.get("config") or {})
    path = cfg.get("path")
    if path:
        problem = local_folder_problem(path)
        if problem:
            raise WorkloadError(problem)
        try:
            saved = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, TypeError) as exc:
            raise WorkloadError(f"path {path!r}: transformers cannot read its config.json: {_first_line(exc)}") from None
        _refuse_unknown_overrides(type(saved), overrides, f"path {path!r} ({saved.model_type})")
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, **overrides)
        if cfg.get("model_type") and cfg["model_type"] != config.model_type:
            raise WorkloadError(f"path {path!r} holds a {config.model_type!r} model, and the workload says model_type "
                                f"{cfg['model_type']!r}; remove model_type or fix it")
        return _no_cache(config, overrides)
    model_type = cfg.get("model_type")
    known = sorted(transformers.CONFIG_MAPPING.keys())
    if model_type not in transformers.CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), known, n=3)
        raise WorkloadError(f"model_type {model_type!r} is not a model type of transformers "
                            f"{transformers.__version__} (AutoConfig)"
                            + (f"; did you mean {', '.join(map(repr, close))}?" if close else
                               f"; the known types: transformers.CONFIG_MAPPING.keys() ({len(known)})"))
    config_class = transformers.CONFIG_MAPPING[model_type]
    try:
        config = config_class(**overrides)
    except (TypeError, ValueError, AttributeError) as exc:
        raise WorkloadError(f"model_type {model_type!r}: the config overrides {sorted(overrides)} are refused by "
                            f"{config_class.__name__}: {_first_line(exc)}; fix the workload's config:") from None
    _refuse_unknown_overrides(config_class, overrides, f"model_type {model_type!r}")
    return _no_cache(config, overrides)


def _refuse_unknown_overrides(config_class, overrides: dict, what: str) -> None:
    """PretrainedConfig keeps an unknown keyword as an attribute (or drops it): a name its defaults and attribute
    map do not know is a typo, which would leave the model at its default size (or, with ``path``, at the saved
    one). Raises WorkloadError naming the unknown keys and the closest known ones."""
    known = set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {}) or {})
    unknown = sorted(k for k in overrides if k not in known and not hasattr(config_class, k))  # num_labels: a property
    if unknown:
        close = sorted({m for k in unknown for m in difflib.get_close_matches(k, sorted(known), n=2)})
        raise WorkloadError(f"{what}: config override(s) {unknown} are not attributes of {config_class.__name__}"
                            + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
                            + "; fix the workload's config:")


def _no_cache(config, overrides: dict):
    """``use_cache`` off where the config has it and the overrides leave it unset (a profiled forward never reads the
    KV cache it would build and return)."""
    if hasattr(config, "use_cache") and "use_cache" not in overrides:
        config.use_cache = False
    return config


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0]


def positional_forward(model: nn.Module, names: tuple[str, ...]) -> nn.Module:
    """Swap ``model``'s class for a subclass of the same name whose ``forward(*tensors)`` calls the HF forward with
    ``dict(zip(names, tensors))`` (module docstring); returns ``model``. The subclass records ``names``
    (``opprof_input_names``)."""
    parent = type(model)
    parent_forward = parent.forward

    def forward(self, *tensors):
        return parent_forward(self, **dict(zip(names, tensors)))

    sub = type(parent.__name__, (parent,), {"forward": forward, "opprof_input_names": names,
                                            "__module__": parent.__module__, "__qualname__": parent.__qualname__})
    model.__class__ = sub
    return model


def _int(config, *keys: str) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def make_inputs(model: nn.Module, cfg: dict, device: torch.device, train: bool) -> dict[str, torch.Tensor]:
    """The named inputs of one call (module docstring), on ``device``. Raises WorkloadError for a model whose
    main input is neither token ids nor pixel values, a sequence longer than the model's positions, or an image
    classification train step without ``num_labels``."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    batch = int(cfg["batch_size"])
    task = cfg["task"]
    inputs: dict[str, torch.Tensor] = {}
    # a multimodal model (CLIP, LLaVA, Whisper's encoder-decoder with audio) takes its main input and another
    # modality's: token ids alone would leave pixel values (or audio features) None inside its forward
    others = sorted(k for k in ("vision_config", "audio_config", "speech_config") if getattr(config, k, None) is not None)
    if others and main == "input_ids":
        raise WorkloadError(f"{config.model_type}: a multimodal model (its config has {', '.join(others)}); kind "
                            "transformers makes one modality's inputs only; profile it with kind: custom and a "
                            "factory that makes all its inputs")
    if main == "input_ids":
        vocab = _int(config, "vocab_size") or _int(getattr(config, "get_text_config", lambda: config)(), "vocab_size")
        if vocab is None:
            raise WorkloadError(f"{config.model_type}: its config has no vocab_size, so no token ids can be made; "
                                "set config: {vocab_size: N}")
        seq = int(cfg["seq_len"])
        limit = _int(config, "max_position_embeddings", "n_positions", "max_seq_len")
        if limit is not None and seq > limit:
            raise WorkloadError(f"{config.model_type}: seq_len ({seq}) exceeds the model's positions ({limit}, "
                                "max_position_embeddings); lower seq_len or raise it in config")
        # token ids from a seeded generator of their own: the same ids whatever ran before
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (batch, seq), generator=generator)
        inputs["input_ids"] = ids
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        if getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq), generator=generator)
        if train and task in ("causal-lm", "masked-lm", "seq2seq-lm"):
            inputs["labels"] = (inputs["decoder_input_ids"] if "decoder_input_ids" in inputs else ids).clone()
    elif main == "pixel_values":
        channels = _int(config, "num_channels") or 3
        size = cfg.get("image_size") or _int(config, "image_size") or 224
        generator = torch.Generator().manual_seed(0)
        dtype = DTYPES[cfg.get("dtype", "float32")]
        inputs["pixel_values"] = torch.randn(batch, channels, size, size, generator=generator).to(dtype)
        if train and task == "image-classification":
            labels = _int(config, "num_labels") or len(getattr(config, "id2label", {}) or {}) or 2
            inputs["labels"] = torch.randint(0, labels, (batch,), generator=generator)
    else:
        raise WorkloadError(f"{config.model_type}: its main input is {main!r}; kind transformers makes token ids "
                            "(input_ids) and pixel values (pixel_values) only; profile it with kind: custom and a "
                            "factory that makes its inputs")
    return {k: v.to(device) for k, v in inputs.items()}


def build_transformers(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    """``(model, example_inputs)`` of a ``kind: transformers`` workload (module docstring).

    Raises:
        WorkloadError: transformers not installed (names the extra), unknown model type or task for it, a ``path``
            that is not a local checkpoint folder, bad config overrides, a main input other than token ids or
            pixel values.
    """
    transformers = _import()
    task = cfg.get("task", "base")
    if task not in TASKS:
        raise WorkloadError(f"task {task!r} is not one of {', '.join(TASKS)}")
    attn = cfg.get("attn_implementation")
    if attn is not None and attn not in ATTN_IMPLEMENTATIONS:
        raise WorkloadError(f"attn_implementation {attn!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    dtype = DTYPES[cfg.get("dtype", "float32")]
    config = build_config(cfg)
    auto = getattr(transformers, TASKS[task])
    what = f"{config.model_type} ({cfg.get('path') or 'from its config'})"
    try:
        if cfg.get("path"):
            model = auto.from_pretrained(cfg["path"], config=config, local_files_only=True,
                                         attn_implementation=attn, dtype=dtype)
        else:
            if getattr(config, "architectures", None) is None:
                # a task with several classes (DeiT's image classification: with and without the distillation
                # teacher) is picked by config.architectures, which transformers iterates even when it is None
                # (TypeError); empty, it takes the task's default class, the first
                config.architectures = []
            model = auto.from_config(config, attn_implementation=attn, dtype=dtype)
    except ValueError as exc:
        text = _first_line(exc)
        if "Unrecognized configuration class" in text or "model type" in text.lower():
            raise WorkloadError(f"{what}: transformers has no {TASKS[task]} for it (task {task!r}); choose another "
                                f"task ({', '.join(TASKS)})") from None
        if "attn_implementation" in text or "attention" in text.lower():
            raise WorkloadError(f"{what}: attn_implementation {attn!r} is refused: {text[:200]}; set "
                                "attn_implementation: eager, or leave it unset (null: the model's default)") from None
        raise WorkloadError(f"{what}: {text}") from None
    except ImportError as exc:  # a model needing a package transformers lacks here
        raise WorkloadError(f"{what}: {_first_line(exc)}") from None
    except (AssertionError, TypeError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
        # a config whose values contradict each other (whisper's pad_token_id 50257 beyond a vocab_size of 128:
        # "Padding_idx must be within num_embeddings"): the user's config, not a bug of this program
        raise WorkloadError(f"{what}: transformers cannot build it from this config: {type(exc).__name__}: "
                            f"{_first_line(exc)}; check the workload's config: overrides against each other "
                            "(token ids within vocab_size, widths divisible by the head count)") from None
    except OSError as exc:
        raise WorkloadError(f"{what}: cannot load it: {_first_line(exc)}") from None
    model = model.to(device=device, dtype=dtype)
    train = cfg.get("mode", "inference") == "train"
    inputs = make_inputs(model, {**cfg, "task": task}, device, train)
    positional_forward(model, tuple(inputs))
    return model, tuple(inputs.values())


def describe(model: nn.Module) -> dict[str, Any]:
    """What run.json records about an HF model: class, model type, attention implementation, input names."""
    config = getattr(model, "config", None)
    return {"class": type(model).__name__, "model_type": getattr(config, "model_type", None),
            "attn_implementation": getattr(config, "_attn_implementation", None),
            "inputs": list(getattr(model, "opprof_input_names", ()))}
