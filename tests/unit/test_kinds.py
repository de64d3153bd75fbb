"""kinds/: three small protocols, every implementation holding to its own, `kind_for` choosing the right
three from the spec, no kind or task switch outside kinds/, and docs/adding-a-kind.md naming exactly the
protocols' members and modules that exist."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from entrypoint.kinds import DataSide, ModelSide, TaskSide, kind_for
from entrypoint.kinds.causal_lm import CausalLM
from entrypoint.kinds.classification import Classification
from entrypoint.kinds.extraction import Extraction
from entrypoint.kinds.format import Format
from entrypoint.kinds.image_classifier import ImageClassifier
from entrypoint.kinds.images import ImageData
from entrypoint.kinds.text import TextData
from entrypoint.kinds.text_classifier import TextClassifier
from tests.specs import load, tiny_job

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = {"DataSide": DataSide, "ModelSide": ModelSide, "TaskSide": TaskSide}
IMPLEMENTATIONS = {
    "DataSide": [TextData, ImageData],
    "ModelSide": [TextClassifier, ImageClassifier, CausalLM],
    "TaskSide": [Classification, Format, Extraction],
}


def members(protocol) -> set[str]:
    """A Protocol's declared members: its methods and annotated attributes."""
    own = {n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}
    return own | set(getattr(protocol, "__annotations__", {}))


def test_each_protocol_has_at_most_seven_members():
    for name, protocol in PROTOCOLS.items():
        assert 0 < len(members(protocol)) <= 7, f"{name}: {sorted(members(protocol))}"


@pytest.mark.parametrize("protocol", sorted(IMPLEMENTATIONS))
def test_every_implementation_has_every_member_of_its_protocol(protocol):
    wanted = members(PROTOCOLS[protocol])
    for implementation in IMPLEMENTATIONS[protocol]:
        missing = {
            m for m in wanted if not hasattr(implementation, m) and m not in _instance_attributes(implementation)
        }
        assert not missing, f"{implementation.__name__} lacks {sorted(missing)} of {protocol}"
        for name in wanted:
            declared = vars(PROTOCOLS[protocol]).get(name)
            if inspect.isfunction(declared):  # same parameters, so a caller of the protocol works with it
                theirs = list(inspect.signature(getattr(implementation, name)).parameters)
                assert theirs == list(inspect.signature(declared).parameters), f"{implementation.__name__}.{name}"


def _instance_attributes(cls) -> set[str]:
    """Attributes set in __init__ (self.x = ...)."""
    tree = ast.parse(inspect.getsource(cls))
    return {
        t.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def _spec(**sections):
    return load(tiny_job("k", Path("/models/any"), **sections)).spec


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({}, ("text_classifier", TextData, TextClassifier, Classification, True)),
        (
            {"data": {"source": "/data/images", "modality": "image"}},
            ("image_classifier", ImageData, ImageClassifier, Classification, False),
        ),
        (
            {"hypothesis": {"task": "format", "statement": "s", "format": {"expect_json": True}}},
            ("causal_lm", TextData, CausalLM, Format, True),
        ),
        (
            {"hypothesis": {"task": "extraction", "statement": "s", "required_fields": ["a"]}},
            ("causal_lm", TextData, CausalLM, Extraction, True),
        ),
    ],
)
def test_kind_for_bundles_the_three_sides_the_spec_describes(sections, expected):
    kind = kind_for(_spec(**sections))
    name, data, model, task, stores_tokens = expected
    assert (kind.name, type(kind.data), type(kind.model), type(kind.task)) == (name, data, model, task)
    assert kind.stores_tokens is stores_tokens
    assert kind.task.name == kind_for(_spec(**sections)).task.name


def test_the_loss_weighting_follows_the_task():
    assert kind_for(_spec()).task.loss == "example"
    format_spec = _spec(hypothesis={"task": "format", "statement": "s", "format": {"expect_json": True}})
    assert kind_for(format_spec).task.loss == "token"


def _kind_names() -> set[str]:
    """Every kind's name: the first argument of each `Kind(...)` that kinds/__init__.py builds."""
    tree = ast.parse((ROOT / "entrypoint/kinds/__init__.py").read_text())
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Kind" and node.args
        if isinstance(node.args[0], ast.Constant)
    }


KIND_NAMES = _kind_names()


def _switches(path: Path, root: Path = ROOT) -> list[str]:
    """Comparisons of a task or modality (`spec.hypothesis.task == ...`, `results["hypothesis"]["task"] != ...`)
    or of a kind's name (`kind.name == ...`, or any comparison with a kind's name literal), a dict keyed by a
    kind's name or a lookup with one, and `hasattr(kind, ...)`."""
    found = []

    def hit(node: ast.AST) -> None:
        found.append(f"{path.relative_to(root)}:{node.lineno}")

    def names_a_kind(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in KIND_NAMES

    def switches_on(side: ast.AST) -> bool:
        """One side of a comparison: a task, a modality, a kind's name, or a kind's name literal."""
        if isinstance(side, ast.Attribute) and side.attr in ("task", "modality"):
            return True
        if isinstance(side, ast.Subscript) and getattr(side.slice, "value", None) in ("task", "modality"):
            return True
        if isinstance(side, ast.Attribute) and side.attr == "name" and "kind" in ast.unparse(side.value):
            return True
        elements = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
        return any(map(names_a_kind, elements))

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(map(switches_on, (node.left, *node.comparators))):
            hit(node)
        if isinstance(node, ast.Dict) and any(map(names_a_kind, node.keys)):
            hit(node)
        if isinstance(node, ast.Subscript) and names_a_kind(node.slice):
            hit(node)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr":
            first = ast.unparse(node.args[0]) if node.args else ""
            if "kind" in first:
                hit(node)
    return found


def test_no_kind_or_task_switch_outside_kinds():
    assert KIND_NAMES == {"causal_lm", "text_classifier", "image_classifier"}  # the detector knows every kind
    found = [
        hit
        for path in sorted((ROOT / "entrypoint").rglob("*.py"))
        if "kinds" not in path.relative_to(ROOT).parts
        for hit in _switches(path)
    ]
    assert not found, f"kind or task switches outside kinds/: {found}"


def test_the_switch_check_sees_a_switch(tmp_path):
    path = tmp_path / "switch.py"  # not under entrypoint/, which the layer test reads on another worker
    path.write_text(
        "def f(spec, kind, results, name):\n"
        '    if spec.hypothesis.task == "format" or results["hypothesis"]["task"] != "x":\n'
        '        hasattr(kind, "log")\n'
        '    if name in ("causal_lm", "other") or name == "image_classifier":\n'
        '        return {"text_classifier": 1}, CLASSES["causal_lm"]\n'
        '    return kind.name == "causal_lm"\n'
    )
    assert len(_switches(path, root=tmp_path)) == 8
    path.write_text('def f(kind):\n    return kind.serving.usage.generative and "causal" in kind.title\n')
    assert _switches(path, root=tmp_path) == []


def test_adding_a_kind_names_exactly_the_protocols_members_and_real_modules():
    text = (ROOT / "docs/adding-a-kind.md").read_text()
    sections = re.split(r"^### ", text, flags=re.M)[1:]
    documented = {}
    for section in sections:
        name = section.split(":", 1)[0].strip()
        documented[name] = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert set(documented) == set(PROTOCOLS)
    for name, protocol in PROTOCOLS.items():
        assert documented[name] == members(protocol), f"docs/adding-a-kind.md, {name}"
    for module in re.findall(r"`kinds/(\w+)\.py`", text):
        assert (ROOT / "entrypoint/kinds" / f"{module}.py").is_file(), f"docs/adding-a-kind.md names kinds/{module}.py"
