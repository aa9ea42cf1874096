"""scikit-learn models as users export them with skl2onnx, trained here on real data.

- `digits`: the handwritten digits data set scikit-learn ships (1797 8x8 images, pixel
  values scaled to 0..1), split into training, calibration and validation rows.
- `build_digits_mlp`: an `MLPClassifier` (one hidden ReLU layer). Exported with skl2onnx's
  defaults it ends in a ZipMap (`output_probability`, a sequence of maps); with
  `zipmap=False` its outputs are `label` INT64 `[N]` and `probabilities` FP32 `[N, 10]`,
  its layers MatMul + Add with biases of shape `[1, N]` (the form onnxruntime#24815 trips
  on when quantising).
- `build_digits_linear`: a `LogisticRegression`, exported as `ai.onnx.ml` operators only
  (LinearClassifier, Normalizer): nothing int8 can quantise.
- `build_text_classifier`: a `TfidfVectorizer` + `LogisticRegression` pipeline on a small
  corpus of sentences about three topics, STRING input `text` `[N, 1]`, outputs `label`
  STRING `[N]` (the topic) and `probabilities`. With `extensions=True` the graph starts
  with onnxruntime-extensions operators (`StringLower`, `StringRegexReplace` in
  `ai.onnx.contrib`) that normalise the raw text, merged into one graph: text in, label
  out.

Each builder returns the fitted estimator beside the path, so a test judges the served
answers by scikit-learn's own predictions. skl2onnx's text tokenizer is given the "C"
locale: its default (en_US.UTF-8) is missing from minimal images, where ONNX Runtime
refuses the model at load.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx

OPSETS = {"": 17, "ai.onnx.ml": 3}

TOPICS = {
    "sport": [
        "the striker scored a late goal in the final match",
        "our team won the league after a tense penalty shootout",
        "the goalkeeper saved the penalty and the crowd cheered",
        "she ran the marathon in under three hours",
        "the coach picked a new captain for the football season",
        "tennis players trained on the clay court all week",
        "the cyclist won the mountain stage of the race",
        "fans filled the stadium for the championship game",
        "the referee showed a red card in the second half",
        "he broke the world record in the hundred metres",
        "the basketball team lost at home in overtime",
        "swimmers prepared for the relay at the olympic pool",
    ],
    "weather": [
        "heavy rain and strong wind are expected tonight",
        "the forecast says sunny skies with a light breeze",
        "snow fell overnight and the roads are icy",
        "a storm warning was issued for the coast",
        "temperatures will drop below freezing this weekend",
        "thick fog delayed flights at the airport this morning",
        "the heatwave brought record temperatures to the city",
        "showers will clear by the afternoon with some sunshine",
        "thunder and lightning rolled across the valley",
        "a cold front brings cloudy skies and drizzle",
        "the hurricane gained strength over warm ocean water",
        "frost covered the fields after a clear cold night",
    ],
    "cooking": [
        "simmer the tomato sauce with garlic and fresh basil",
        "knead the dough and let the bread rise for an hour",
        "roast the chicken with lemon rosemary and potatoes",
        "whisk the eggs with sugar until the mixture is pale",
        "fry the onions in butter until golden and sweet",
        "bake the cake in a hot oven for forty minutes",
        "season the soup with salt pepper and a little cream",
        "chop the vegetables and stir fry them in a wok",
        "the recipe needs flour butter and a pinch of salt",
        "grill the fish and serve it with a green salad",
        "melt the chocolate slowly over a pan of hot water",
        "boil the pasta and toss it with olive oil and cheese",
    ],
}
"""A small corpus: twelve sentences per topic, the last three of each held out."""

HELD_OUT_PER_TOPIC = 3


@dataclass(frozen=True)
class Digits:
    train_x: np.ndarray
    train_y: np.ndarray
    calibration_x: np.ndarray
    """Rows for a calibration file (int8 calibrates on its first 80 %, holds out the rest)."""
    validation_x: np.ndarray
    validation_y: np.ndarray


@cache
def digits() -> Digits:
    """The digits data set, pixels scaled to 0..1 as float32, split 1200/300/297."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return Digits(x[:1200], y[:1200], x[1200:1500], x[1500:], y[1500:])


def _quietly_fit(estimator: Any, x: Any, y: Any) -> Any:
    """Fits on one BLAS thread: on a shared two-core machine the default pool of threads
    turns a fit of a tenth of a second into tens of seconds."""
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(x, y)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def build_digits_mlp(path: Path, *, zipmap: bool = False) -> tuple[Path, Any]:
    """The digits MLP (see the module) at `path`, with or without skl2onnx's ZipMap."""
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPClassifier

    data = digits()
    classifier = MLPClassifier(hidden_layer_sizes=(64,), solver="lbfgs", random_state=0)
    _quietly_fit(classifier, data.train_x, data.train_y)
    options = None if zipmap else {id(classifier): {"zipmap": False}}
    model = to_onnx(classifier, data.train_x[:1], options=options, target_opset=OPSETS)
    return _save(model, path), classifier


def build_digits_linear(path: Path) -> tuple[Path, Any]:
    """The digits logistic regression, `ai.onnx.ml` operators only (no ZipMap)."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    data = digits()
    classifier = _quietly_fit(LogisticRegression(max_iter=500), data.train_x, data.train_y)
    options = {id(classifier): {"zipmap": False}}
    model = to_onnx(classifier, data.train_x[:1], options=options, target_opset=OPSETS)
    return _save(model, path), classifier


def mixed_sentences(count: int, seed: int = 0) -> list[str]:
    """Sentences of words drawn from two topics at once: where classifiers differ."""
    rng = np.random.default_rng(seed)
    words = {topic: " ".join(sentences).split() for topic, sentences in TOPICS.items()}
    sentences = []
    for _ in range(count):
        first, second = rng.choice(list(TOPICS), 2, replace=False)
        picked = [*rng.choice(words[first], 3), *rng.choice(words[second], 3)]
        sentences.append(" ".join(str(word) for word in picked))
    return sentences


def text_split() -> tuple[list[str], list[str], list[str], list[str]]:
    """(training texts, their topics, held-out texts, their topics)."""
    train, train_y, held, held_y = [], [], [], []
    for topic, sentences in TOPICS.items():
        cut = len(sentences) - HELD_OUT_PER_TOPIC
        train += sentences[:cut]
        train_y += [topic] * cut
        held += sentences[cut:]
        held_y += [topic] * HELD_OUT_PER_TOPIC
    return train, train_y, held, held_y


def build_text_classifier(
    path: Path, *, extensions: bool = False, per_topic: int | None = None
) -> tuple[Path, Any]:
    """The TF-IDF topic classifier (see the module); with `extensions`, behind an
    onnxruntime-extensions normalisation of the raw text, in one graph. `per_topic`
    trains on that many sentences of each topic only (a model that knows fewer words,
    which disagrees with the full one on mixed sentences)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    train, train_y, _, _ = text_split()
    if per_topic is not None:
        kept = [i for i, topic in enumerate(train_y) if train_y[: i + 1].count(topic) <= per_topic]
        train, train_y = [train[i] for i in kept], [train_y[i] for i in kept]
    vectorizer, classifier = TfidfVectorizer(), LogisticRegression(max_iter=500)
    pipeline = _quietly_fit(make_pipeline(vectorizer, classifier), train, train_y)
    model = convert_sklearn(
        pipeline,
        initial_types=[("text", StringTensorType([None, 1]))],
        options={id(classifier): {"zipmap": False}, id(vectorizer): {"locale": "C"}},
        target_opset=OPSETS,
    )
    if extensions:
        model = _behind_text_normalisation(model)
    return _save(model, path), pipeline


def normalised(text: str) -> str:
    """What `_behind_text_normalisation`'s operators make of a text."""
    return re.sub(r"[^a-z ]", "", text.lower())


def _behind_text_normalisation(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (input `text`) fed by onnxruntime-extensions operators: the raw input
    `raw_text` lower-cased and stripped of everything but letters and spaces."""
    from onnx import TensorProto, compose, helper

    contrib = "ai.onnx.contrib"
    graph = helper.make_graph(
        [
            helper.make_node("StringLower", ["raw_text"], ["lowered"], domain=contrib),
            helper.make_node(
                "StringRegexReplace", ["lowered", "pattern", "rewrite"], ["clean"], domain=contrib
            ),
        ],
        "normalise",
        [helper.make_tensor_value_info("raw_text", TensorProto.STRING, [None, 1])],
        [helper.make_tensor_value_info("clean", TensorProto.STRING, [None, 1])],
        initializer=[
            helper.make_tensor("pattern", TensorProto.STRING, [1], [b"[^a-z ]"]),
            helper.make_tensor("rewrite", TensorProto.STRING, [1], [b""]),
        ],
    )
    default = [o for o in model.opset_import if o.domain == ""]
    normalise = helper.make_model(
        graph,
        opset_imports=[*default, helper.make_opsetid(contrib, 1)],
        ir_version=model.ir_version,
    )
    return compose.merge_models(normalise, model, io_map=[("clean", "text")])
