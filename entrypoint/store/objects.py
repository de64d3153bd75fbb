"""The one reader for JSON objects rentune stored: unreadable content becomes an error naming the object.

Everything rentune writes to a store as JSON is an object (a mapping). `read_json` returns it with every
mapping inside it wrapped so that a missing field is a `CorruptObject` naming the object and the field,
not a bare KeyError deep in a phase. Truncated bytes, bytes that are not UTF-8 or not JSON, or a top level
that is not a mapping are a `CorruptObject` too. `loads_object` does the same for a local file (an export's
BINDING.json on a laptop).
"""

from __future__ import annotations

import json
from typing import Any

from entrypoint.errors import InvalidInput
from entrypoint.store.base import Store, StoreError

__all__ = ["CorruptObject", "StoredObject", "loads_object", "read_json"]


class CorruptObject(StoreError, InvalidInput):
    """A stored object rentune cannot read: the message names it and says what was expected (exit 2)."""


class StoredObject(dict):
    """A mapping read from `where`; `obj[field]` for a field that is not there raises CorruptObject."""

    def __init__(self, items: dict, where: str):
        super().__init__(items)
        self.where = where

    def __missing__(self, field: str) -> Any:
        raise CorruptObject(f"{self.where}: no field {field!r}; expected the object rentune wrote there")


def loads_object(data: bytes, where: str) -> StoredObject:
    """Parse `data` (the bytes of `where`) as a JSON object; CorruptObject when it is not one."""
    try:
        obj = json.loads(data.decode("utf-8"), object_hook=lambda items: StoredObject(items, where))
    except UnicodeDecodeError as exc:
        raise CorruptObject(f"{where}: not UTF-8 text (byte {exc.start}); expected the JSON rentune wrote") from None
    except json.JSONDecodeError as exc:
        raise CorruptObject(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}; truncated or "
            "overwritten?); expected the JSON object rentune wrote"
        ) from None
    if not isinstance(obj, StoredObject):
        raise CorruptObject(f"{where}: holds a JSON {type(obj).__name__}; expected the JSON object rentune wrote")
    return obj


def read_json(store: Store, key: str) -> StoredObject:
    """The JSON object stored at `key`. Raises ObjectNotFound when absent, CorruptObject when unreadable."""
    return loads_object(store.get_bytes(key), f"{store.uri.rstrip('/')}/{key}")
