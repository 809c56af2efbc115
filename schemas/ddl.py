"""Column types of record contracts for the engines that declare them (Spark-style DDL for Feast, Flink SQL)."""

from __future__ import annotations

import typing
from typing import Literal

from schemas.records import Record

_SQL_TYPES = {str: "STRING", int: "BIGINT", float: "DOUBLE", bool: "BOOLEAN"}


def column_types(record_type: type[Record]) -> dict[str, str]:
    """SQL type of every scalar field of ``record_type``, in declaration order."""
    columns = {}
    for name, field in record_type.model_fields.items():
        annotation = field.annotation
        if typing.get_origin(annotation) is Literal:
            annotation = type(typing.get_args(annotation)[0])
        if annotation in _SQL_TYPES:
            columns[name] = _SQL_TYPES[annotation]
    return columns


def ddl(record_type: type[Record]) -> str:
    """``name TYPE, ...`` for the scalar fields of ``record_type`` (Feast's JsonFormat takes this form)."""
    return ", ".join(f"{name} {sql_type}" for name, sql_type in column_types(record_type).items())
