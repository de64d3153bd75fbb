"""What differs between jobs, in three small protocols, bundled once from the spec by `kind_for`:

    DataSide    one per modality: read the sources, find leaks, commit and fetch the splits, what
                identifies an example, the recipe and the inspection
                    text.py         JSONL / Parquet / saved datasets, text fields or conversations
                    images.py       ImageFolder or JSONL of image files, stored content-addressed
    ModelSide   one per model family: the processor, encoding, batching, loading, predicting, the
                untouched model's baseline and the settings that decide a measurement
                    text_classifier.py   an encoder with a new head; zero-shot baseline
                    image_classifier.py  a vision model with a new head; centroid baseline
                    causal_lm.py         prompt -> generated response; untouched-model baseline
    TaskSide    one per task: scoring, per-example counts for the intervals, the loss weighting, the
                eval settings and what the report shows
                    classification.py    format.py    extraction.py

Phases never ask which kind they run: they call `ctx.kind.data`, `ctx.kind.model` and `ctx.kind.task`.
Adding a modality, a model family or a task is one new module implementing its protocol, its spec
fields in jobspec/schema.py and a line in `kind_for` (docs/adding-a-kind.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from entrypoint.data.encoding import Encoded
from entrypoint.kinds.base import Baseline, DataSide, Kind, ModelSide, Serving, TaskSide
from jobspec.schema import JobSpec

__all__ = ["Baseline", "DataSide", "Kind", "ModelSide", "Serving", "TaskSide", "encoder_for", "kind_for"]

AGREEMENT = 0.99  # a merged classifier answers as its adapter on at least this share of eval (docs/serving.md)


def kind_for(
    spec: JobSpec,
    log: Callable[[str], None] | None = None,
    read_quantization_record: Callable[[], dict | None] | None = None,
) -> Kind:
    """The kind of job `spec` describes: images -> image classifier; format and extraction tasks generate
    text -> causal LM; classification of text -> text classifier. `log`: where the model side reports as
    it goes (generation throughput). `read_quantization_record`: reads QLoRA's quantized-base record of
    the job (base_model.json), which the causal LM's quantized loads must reproduce."""
    from entrypoint.kinds.classification import Classification
    from entrypoint.kinds.extraction import Extraction
    from entrypoint.kinds.format import Format

    task = {"classification": Classification, "format": Format, "extraction": Extraction}[spec.hypothesis.task](spec)
    if spec.data.modality == "image":
        from entrypoint.kinds.image_classifier import USAGE as IMAGE_USAGE
        from entrypoint.kinds.image_classifier import ImageClassifier
        from entrypoint.kinds.images import ImageData

        model = ImageClassifier(spec)
        serving = Serving(model.scores, stop_tokens=None, agreement=AGREEMENT, usage=IMAGE_USAGE)
        return Kind("image_classifier", ImageData(spec, model), model, task, stores_tokens=False, serving=serving)
    from entrypoint.kinds.text import TextData

    if spec.generates:  # format and extraction tasks on text
        from entrypoint.kinds.causal_lm import USAGE as CAUSAL_USAGE
        from entrypoint.kinds.causal_lm import CausalLM

        model = CausalLM(spec, log, read_quantization_record)
        serving = Serving(model.scores, stop_tokens=model.stop_tokens, agreement=None, usage=CAUSAL_USAGE)
        return Kind(
            "causal_lm", TextData(spec, model.fields(), model), model, task, stores_tokens=True, serving=serving
        )
    from entrypoint.kinds.text_classifier import USAGE as TEXT_USAGE
    from entrypoint.kinds.text_classifier import TextClassifier

    model = TextClassifier(spec)
    serving = Serving(model.scores, stop_tokens=None, agreement=AGREEMENT, usage=TEXT_USAGE)
    data = TextData(spec, model.fields(), model)
    return Kind("text_classifier", data, model, task, stores_tokens=True, serving=serving, encodes_in_tokenizer=True)


def encoder_for(spec: JobSpec, model_dir: str, labels: list[str]) -> Callable[[Sequence[dict]], list[Encoded]]:
    """The model side's encoder for `spec`, with its processor loaded once: what each tokenizing process of
    the data phase runs (data/tokens.py)."""
    model = kind_for(spec).model
    processor = model.processor(Path(model_dir))
    return lambda rows: model.encode(processor, rows, labels)
