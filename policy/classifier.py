"""The classifier late detector: a local Hugging Face sequence-classification model.

A late detector is policy, so it lives in ``fak.policy``; it needs torch and
``transformers`` (the optional extra ``fak[classifier]``), which are imported only when a
classifier is built or scores, and ``fak.policy.late.build_detectors`` imports this module
only when a policy configures ``kind: classifier``: importing ``fak.policy`` never loads
torch. Nothing is ever downloaded: the model is a folder.

Long texts are cut into windows of the model's maximum length that overlap by a
quarter, and the text scores the maximum over its windows, so an instruction buried
past the first window is still seen and one straddling a cut is whole in some window.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fak.policy.late_detector import LateDetectorFailed, LateDetectorInvalid, LateFinding
from fak.policy.schema import LateDetectorRule

DEFAULT_MAX_LENGTH = 512  # when neither the tokenizer nor the config says
_CACHE: dict[str, tuple[int, Any, Any, threading.Lock]] = {}  # folder -> (config mtime, tokenizer, model, lock)
_CACHE_LOCK = threading.Lock()


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise LateDetectorInvalid("a 'classifier' late detector needs the transformers package: "
                                  "pip install 'fak[classifier]'") from exc
    return transformers


def load_classifier(path: str | Path, rule_id: str = "classifier") -> tuple[Any, Any, threading.Lock]:
    """(tokenizer, model, tokenizer lock) of a sequence-classification folder, on CPU in eval
    mode; cached per folder (the latest config version only), so a policy reload does not load
    the weights again. Code shipped in the folder is never run (``trust_remote_code`` off),
    and a folder whose weights do not cover the model (a head left random) is refused. A fast
    tokenizer's truncation settings are shared state, so callers tokenize under the lock
    (concurrent calls can fail with "Already borrowed"); the forward needs none."""
    folder = Path(path).expanduser()
    config_file = folder / "config.json"
    if not folder.is_dir():
        raise LateDetectorInvalid(f"late detector {rule_id!r}: model folder {str(folder)!r} does not exist")
    if not config_file.is_file():
        raise LateDetectorInvalid(f"late detector {rule_id!r}: {str(folder)!r} is not a Hugging Face model "
                                  "folder (no config.json)")
    key, mtime = str(folder.resolve()), config_file.stat().st_mtime_ns
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None and cached[0] == mtime:
            return cached[1], cached[2], cached[3]
        tf = _transformers()
        try:
            config = tf.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise LateDetectorInvalid(f"late detector {rule_id!r}: cannot read {str(config_file)!r}: {exc}") from exc
        architectures = list(getattr(config, "architectures", None) or [])
        if not any(a.endswith("ForSequenceClassification") for a in architectures):
            # AutoModelForSequenceClassification would happily put a random head on a causal LM
            raise LateDetectorInvalid(
                f"late detector {rule_id!r}: {str(folder)!r} is not a sequence-classification model "
                f"(architectures: {architectures or 'none'}); want e.g. BertForSequenceClassification")
        try:
            tokenizer = tf.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
            model, info = tf.AutoModelForSequenceClassification.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False, output_loading_info=True)
        except (OSError, ValueError) as exc:
            raise LateDetectorInvalid(f"late detector {rule_id!r}: cannot load {str(folder)!r}: {exc}") from exc
        missing = sorted(info.get("missing_keys") or [])
        if missing:  # transformers would initialise them at random and only warn
            raise LateDetectorInvalid(f"late detector {rule_id!r}: the weights in {str(folder)!r} do not cover "
                                      f"the model (missing: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})")
        model.to("cpu").float().eval()
        lock = threading.Lock()
        _CACHE[key] = (mtime, tokenizer, model, lock)
        return tokenizer, model, lock


def pick_label(id2label: dict[int, str], wanted: str | None, rule_id: str = "classifier") -> int:
    """Index of the label that means "injection": ``wanted`` (exact, then any case), else the
    label whose name contains "injection", else index 1 (the usual positive class)."""
    names = {int(i): str(n) for i, n in id2label.items()}
    if wanted is not None:
        for fold in (str, str.lower):
            hits = [i for i, n in names.items() if fold(n) == fold(wanted)]
            if hits:
                return hits[0]
        raise LateDetectorInvalid(f"late detector {rule_id!r}: the model has no label {wanted!r} "
                                  f"(labels: {sorted(names.values())})")
    hits = [i for i, n in sorted(names.items()) if "injection" in n.lower()]
    if hits:
        return hits[0]
    if len(names) < 2:
        raise LateDetectorInvalid(f"late detector {rule_id!r}: a one-label model needs 'label'")
    return 1


class ClassifierDetector:
    """``kind: classifier``: fires when the softmax probability of the injection label on
    any window of the text reaches the rule's threshold."""

    def __init__(self, rule: LateDetectorRule) -> None:
        if not rule.path:
            raise LateDetectorInvalid(f"late detector {rule.id!r}: a classifier needs 'path'")
        self.rule = rule
        self.tokenizer, self.model, self._tokenizer_lock = load_classifier(rule.path, rule.id)
        self.label_index = pick_label(self.model.config.id2label, rule.label, rule.id)
        self.label = str(self.model.config.id2label[self.label_index])
        self.max_length = self._max_length()
        if self.max_length < 8:
            raise LateDetectorInvalid(f"late detector {rule.id!r}: model length {self.max_length} is too short")

    def _max_length(self) -> int:
        candidates = [int(n) for n in (getattr(self.tokenizer, "model_max_length", None),
                                       getattr(self.model.config, "max_position_embeddings", None))
                      if isinstance(n, int) and 0 < n < 1_000_000]
        return min(candidates) if candidates else DEFAULT_MAX_LENGTH

    def windows(self, text: str) -> list[list[int]]:
        """Token ids of each window (special tokens added), consecutive windows sharing a
        quarter of the model length (the tokenizer's own overflow with stride)."""
        if not text.strip():
            return []
        with self._tokenizer_lock:
            enc = self.tokenizer(text, truncation=True, max_length=self.max_length, stride=self.max_length // 4,
                                 return_overflowing_tokens=True)
        ids = enc["input_ids"]
        return [list(w) for w in ids] if ids and isinstance(ids[0], list) else [list(ids)]

    def score(self, text: str) -> float:
        """Maximum probability of the injection label over the windows (0.0 for empty text)."""
        import torch  # the optional dependency: fak.policy itself stays torch-free

        best = 0.0
        with torch.inference_mode():
            for ids in self.windows(text):
                logits = self.model(input_ids=torch.tensor([ids], dtype=torch.long)).logits
                if logits.ndim != 2 or logits.shape[-1] <= self.label_index:
                    raise LateDetectorFailed(f"classifier {self.rule.id!r}: logits of shape {tuple(logits.shape)}")
                best = max(best, float(torch.softmax(logits[0].float(), dim=-1)[self.label_index]))
                if best >= self.rule.threshold:
                    break  # the verdict cannot change; spare the other windows
        return best

    def detect(self, text: str) -> LateFinding | None:
        score = self.score(text)
        if score < self.rule.threshold:
            return None
        return LateFinding(self.rule.id, score, self.label, f"classifier {Path(self.rule.path or '').name}")
