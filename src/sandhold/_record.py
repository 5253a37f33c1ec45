"""Frozen, slotted record classes that cost nothing to import.

`dataclasses` pulls in `inspect` and adds about 10 ms to every CLI start on a
2-core machine, a third of the start-up budget. Policy and plan values only
need what a frozen dataclass gives: an ``__init__`` from the annotations, equality,
hashing, a readable ``repr`` and ``replace``. ``record`` builds exactly that, and
type checkers treat it as a frozen dataclass through ``dataclass_transform``.

Rules: fields are the class's own annotations in order; a field with a class
attribute has that default (only immutable defaults, as with dataclasses);
instances cannot be mutated; ``replace(value, field=…)`` makes a changed copy.
A ``__post_init__`` method, if the class has one, checks every new instance
(``replace`` and unpickling included) and may raise.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~3 ms at start-up; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    _T = TypeVar("_T")
else:

    def dataclass_transform(**_kwargs: object) -> Callable[[_T], _T]:
        return lambda f: f


_MISSING = object()


def _frozen_setattr(self: object, name: str, value: object) -> None:
    raise AttributeError(f"{type(self).__name__} is immutable (tried to set {name!r})")


@dataclass_transform(frozen_default=True)
def record(cls: type[_T]) -> type[_T]:
    """Turn an annotated class into an immutable record (see module doc)."""
    fields = tuple(cls.__dict__.get("__annotations__", {}))  # noqa: RUF063 (inspect is slow)
    defaults = {f: cls.__dict__[f] for f in fields if f in cls.__dict__}
    namespace = {k: v for k, v in cls.__dict__.items() if k not in fields}
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = fields
    namespace["_fields"] = fields

    seen_default = False
    for f in fields:
        if f in defaults:
            seen_default = True
        elif seen_default:
            raise TypeError(f"{cls.__name__}: field {f!r} without default follows one with")
    namespace["_defaults"] = defaults
    namespace["__init__"] = _init_checked if "__post_init__" in namespace else _init
    namespace["__setattr__"] = _frozen_setattr
    namespace["__delattr__"] = _frozen_setattr
    namespace["__repr__"] = _repr
    namespace["__eq__"] = _eq
    namespace["__hash__"] = _hash
    namespace["__reduce__"] = _reduce
    new: Any = type(cls.__name__, cls.__bases__, namespace)
    new.__qualname__ = cls.__qualname__
    new.__module__ = cls.__module__
    return new  # type: ignore[no-any-return]


def _init(self: Any, *args: object, **kwargs: object) -> None:
    # One shared __init__ instead of one generated per class: generating code
    # costs ~0.1 ms a class at import, binding arguments costs microseconds.
    fields = self._fields
    if len(args) > len(fields):
        raise TypeError(f"{type(self).__name__} takes {len(fields)} arguments, got {len(args)}")
    for name, value in zip(fields, args, strict=False):
        object.__setattr__(self, name, value)
    defaults = self._defaults
    for name in fields[len(args) :]:
        if name in kwargs:
            value = kwargs.pop(name)
        elif name in defaults:
            value = defaults[name]
        else:
            raise TypeError(f"{type(self).__name__} missing argument {name!r}")
        object.__setattr__(self, name, value)
    if kwargs:
        raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(kwargs)}")


def _init_checked(self: Any, *args: object, **kwargs: object) -> None:
    _init(self, *args, **kwargs)
    self.__post_init__()


def _values(self: Any) -> tuple[object, ...]:
    return tuple(getattr(self, f) for f in self._fields)


def _repr(self: Any) -> str:
    inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
    return f"{type(self).__name__}({inner})"


def _eq(self: Any, other: object) -> Any:
    if type(other) is not type(self):
        return NotImplemented
    return bool(_values(self) == _values(other))


def _hash(self: Any) -> int:
    return hash((type(self).__name__, _values(self)))


def _reduce(self: Any) -> tuple[object, ...]:
    return (type(self), _values(self))


def replace(value: _T, **changes: object) -> _T:
    """A copy of a record with some fields changed (like ``dataclasses.replace``)."""
    fields: tuple[str, ...] = value._fields  # type: ignore[attr-defined]
    kwargs = {f: getattr(value, f) for f in fields}
    unknown = set(changes) - set(kwargs)
    if unknown:
        raise TypeError(f"{type(value).__name__} has no field(s) {sorted(unknown)}")
    kwargs.update(changes)
    return type(value)(**kwargs)


def as_dict(value: Any) -> dict[str, object]:
    """Fields of a record as a dict (shallow), for JSON output."""
    return {f: getattr(value, f) for f in value._fields}


def is_record(value: object) -> bool:
    return hasattr(type(value), "_fields") and type(value).__eq__ is _eq
