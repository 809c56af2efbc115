"""The engine names no domain: every template's types, fields, views, features, entities and model are collected from
the template itself, with the names the engine once spelled (``TransactionEvent``, ``FraudMLP``, ...), and the
engine's packages are searched for them: their Python, their JVM operators and their gRPC contract.

In Python code (identifiers and string literals) every such name counts, except the engine's own words: its records'
fields (a score request's ``event_id``), the words of its trade, Python's keywords and builtins, and attributes of
the builtin types after a dot (``.items()`` is a dict's, not an order's items). In prose (docstrings, comments), and
anywhere in Java and protobuf files, only the names no sentence uses by chance count: those with an underscore or a
capital inside (``user_transaction_features``, ``TransactionEvent``).
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import re
import sys
import tokenize
from pathlib import Path

import pytest
from feast import RequestSource

from feature_store.config import parse_repo
from loopline.project import template_names, template_path, world_class
from schemas import records
from schemas.project import load_project

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ("streams", "online", "feedback_loop", "offline_training", "feature_store", "schemas")
#: What the engine spelled before domains were projects (issue 33): never again, whatever a template is called.
HISTORICAL = {
    "TransactionEvent",
    "LabelEvent",
    "FraudMLP",
    "FraudWorld",
    "REQUEST_FIELDS",
    "is_fraud",
    "user_transaction_features",
    "merchant_transaction_features",
    "SyntheticStream",
    "fraud_mlp",
}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _domain_names(template: str) -> set[str]:
    """Every name the template declares: its contracts' types, fields and symbols, its Feast repo's entities, join
    keys, views, features and request fields, its label and model, its world's classes."""
    project = load_project(template_path(template))
    names = {project.name, project.spec.model.name, project.labels.value, world_class(project).__name__}
    for contract in project.contracts.values():
        names.add(contract.name)
        for field in contract.fields:
            names.add(field.name)
            names.update(field.symbols)
    repo = parse_repo(project.feature_repo)
    for entity in repo.entities:
        names.update((entity.name, entity.join_key))
    for view in (*repo.stream_feature_views, *repo.feature_views):
        names.add(view.name)
        names.update(field.name for field in view.schema)
    for source in repo.data_sources:
        names.add(source.name)
        if isinstance(source, RequestSource):
            names.update(field.name for field in source.schema)
    world = world_class(project)
    module = sys.modules[world.__module__]
    names.update(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == world.__module__)
    return names


#: Words of the engine's own trade that templates also use as names: Feast's data sources and online store, Kafka's
#: transactions and delivery reports, a sort order. (The fraud labels' ``source``, a payment ``channel``'s ``online``,
#: the delivery template's ``order`` type.) Anything a template names beyond these is searched for.
_TRADE_WORDS = {"source", "online", "transaction", "delivery", "order"}


def _engine_words() -> set[str]:
    """The engine's own vocabulary, which a template may reuse: its records' fields, and the words of its trade."""
    fields = set(_TRADE_WORDS)
    for value in vars(records).values():
        if isinstance(value, type) and issubclass(value, records.Record):
            fields.update(value.model_fields)
    return fields


def _distinctive(name: str) -> bool:
    """A name prose does not use by chance: with an underscore, or a capital past its first letter."""
    return "_" in name.strip("_") or any(c.isupper() for c in name[1:])


#: String tokens: literals, and from Python 3.12 the text parts of f-strings.
_STRINGS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
_BUILTIN_ATTRIBUTES = {a for t in (dict, list, str, bytes, set, tuple, int, float) for a in dir(t)}


def _docstring_starts(source: str) -> set[tuple[int, int]]:
    """Where each docstring (a string standing first in a module, class or function body) begins."""
    starts = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                starts.add((first.lineno, first.col_offset))
    return starts


def _mentions(source: str, names: set[str]) -> list[tuple[int, str, str]]:
    """(line, name, where) of each name ``source`` mentions: in code, any of them; in prose, the distinctive ones."""
    docstrings = _docstring_starts(source)
    found = []
    previous = None
    for kind, text, start, _, _ in tokenize.generate_tokens(io.StringIO(source).readline):
        line = start[0]
        if kind == tokenize.NAME and text in names and not (previous == "." and text in _BUILTIN_ATTRIBUTES):
            found.append((line, text, "code"))
        elif kind in _STRINGS:
            prose = start in docstrings
            found.extend(
                (line, w, "docstring" if prose else "string")
                for w in _WORD.findall(text)
                if w in names and (not prose or _distinctive(w))
            )
        elif kind == tokenize.COMMENT:
            found.extend((line, w, "comment") for w in _WORD.findall(text) if w in names and _distinctive(w))
        previous = text
    return found


def _engine_files(suffix: str = ".py") -> list[Path]:
    return sorted(p for package in ENGINE for p in (ROOT / package).rglob(f"*{suffix}"))


def _prose_mentions(text: str, names: set[str]) -> list[tuple[int, str, str]]:
    """(line, name, "text") of each distinctive name in ``text`` (a Java or protobuf file: all of it read as prose)."""
    return [
        (n, word, "text")
        for n, line in enumerate(text.splitlines(), 1)
        for word in _WORD.findall(line)
        if word in names and _distinctive(word)
    ]


@pytest.fixture(scope="module")
def forbidden() -> dict[str, set[str]]:
    """Each template's names, less the engine's own words and Python's."""
    python = set(keyword.kwlist) | set(dir(builtins))
    allowed = _engine_words() | python
    return {template: _domain_names(template) - allowed for template in template_names()} | {"(history)": HISTORICAL}


def test_the_templates_declare_distinct_domains(forbidden: dict[str, set[str]]) -> None:
    assert set(forbidden) >= {"fraud", "delivery"}
    # What the search looks for: the names the issue found spelled in the engine are among them.
    assert {"is_fraud", "user_transaction_features", "amount"} <= forbidden["fraud"]
    assert {"TransactionEvent", "FraudMLP", "LabelEvent"} <= forbidden["(history)"]
    assert {"restaurant_features", "minutes_to_deliver", "zone", "courier_location", "DeliveryWorld"} <= forbidden["delivery"]


def test_the_search_finds_a_domain_name_where_one_is_written(forbidden: dict[str, set[str]]) -> None:
    names = forbidden["fraud"] | forbidden["delivery"]
    source = (
        '"""Reads user_transaction_features."""\n'
        "def f(event):\n"
        '    """The zone of it."""\n'
        "    return event.amount + event.items() + len(['zone'])  # courier_id\n"
    )
    found = {(line, name, where) for line, name, where in _mentions(source, names)}
    assert found == {
        (1, "user_transaction_features", "docstring"),
        (4, "amount", "code"),
        (4, "zone", "string"),
        (4, "courier_id", "comment"),
    }


def test_no_engine_module_names_a_templates_domain(forbidden: dict[str, set[str]]) -> None:
    names = set().union(*forbidden.values())
    files = _engine_files()
    assert len(files) > 50, "the engine's packages were found"
    others = [*_engine_files(".java"), *_engine_files(".proto")]
    assert others, "the JVM operators and the gRPC contract were found"
    leaks = [
        f"{path.relative_to(ROOT)}:{line}: {name} ({where})"
        for path in files
        for line, name, where in _mentions(path.read_text(), names)
    ]
    leaks += [
        f"{path.relative_to(ROOT)}:{line}: {name} ({where})"
        for path in others
        for line, name, where in _prose_mentions(path.read_text(), names)
    ]
    assert not leaks, "the engine names a template's domain:\n" + "\n".join(leaks)
