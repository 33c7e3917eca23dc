"""The one codec: how events and recorded values become JSON, and come back.

Every value workflow code receives from a durable call passes through
:func:`record` (live) or :func:`convert` (replay). Both end in the same
``convert(plain JSON, annotated type)``, so a live call and a replay hand the
workflow the same value of the same type. A value whose round trip would not
give back an equal value (NaN, a tuple or set without an annotation, a
``datetime`` in an unannotated ``dict``, ...) is refused with a
:class:`SerializationError` before anything is committed.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import functools
import inspect
import math
import sys
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from runifold.errors import SerializationError
from runifold.history._events import AnyEvent

T = TypeVar("T")

def _enc_hook(value: Any) -> Any:
    """Encode what msgspec does not know natively: pydantic models (pydantic is optional)."""
    dump = getattr(value, "model_dump", None)
    if dump is not None and "pydantic" in sys.modules:
        import pydantic

        if isinstance(value, pydantic.BaseModel):
            return dump(mode="json", by_alias=True)  # what validation reads back (aliases, when fields have them)
    if isinstance(value, (bool, tuple, type(None))):  # JSON values msgspec writes itself: here as a dict's key
        raise TypeError(f"a {type(value).__name__} cannot be the key of a dict (JSON object keys are strings): use "
                        "str, int, float, Enum, UUID, date, datetime or Decimal keys")
    for base in (str, int, float):
        if isinstance(value, base):  # a subclass of one (msgspec writes only the type itself): written as that type
            return base(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_sorting_encoder = msgspec.json.Encoder(enc_hook=_enc_hook, order="deterministic")  # sets' members (and keys) sorted
_event_decoder = msgspec.json.Decoder(AnyEvent)
_any_decoder = msgspec.json.Decoder()

_ENCODE_ERRORS = (TypeError, msgspec.EncodeError, OverflowError, UnicodeEncodeError, ValueError)
_ADVICE = (
    "use JSON-compatible data (dict, list, str, int, float, bool, None), a msgspec.Struct, a dataclass or a pydantic "
    "model (datetime, UUID, tuple, set, bytes and Decimal are recorded where the type is annotated as such; "
    "anything else, e.g. a Path, as str or the like), and keep large artifacts outside the log, referenced by id"
)


def _non_finite(value: Any) -> bool:
    """Tell whether ``value`` (builtins) holds a NaN or an infinity anywhere (at any depth: no recursion)."""
    left = [value]
    while left:
        item = left.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            left.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            left.extend(item)
    return False


def encode_value(value: Any, *, what: str | Callable[[], str]) -> bytes:
    """Encode ``value`` as JSON, or raise ``SerializationError`` saying why it cannot be recorded.

    NaN and infinities are refused (JSON has no such numbers: they would come
    back as ``null``), as are strings that are not valid Unicode. ``what`` names the value in an error
    (a function returning the name: built only when there is one).
    """
    problem: BaseException | None = None
    try:
        raw = _encoder.encode(value)
        # invariant: msgspec writes NaN and infinities as null, so only a value with a null can hold one
        if b"null" not in raw or not _non_finite(msgspec.to_builtins(value, enc_hook=_enc_hook)):
            return raw
    except (RecursionError, *_ENCODE_ERRORS) as exc:
        problem = exc
    except Exception as exc:  # the value's own code raised as it was encoded (a model's serializer, say)
        problem = ValueError(f"encoding it raised {type(exc).__name__}: {exc}")
    cause = None if isinstance(problem, RecursionError) else problem
    name = what if isinstance(what, str) else what()
    if inspect.iscoroutine(value):
        value.close()  # it will never run: said here, rather than by Python's "never awaited" warning
        raise SerializationError(f"{name} cannot be recorded: it is a coroutine, what an async call returns before "
                                 "it is awaited; add the missing `await`") from cause
    why = None if isinstance(problem, RecursionError) else _unrecordable(value)
    if why is not None:
        raise SerializationError(f"{name} cannot be recorded: {why}") from cause
    raise _unencodable(problem, name, value) from cause


def _is_non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _unencodable(exc: BaseException | None, what: str, value: Any = None) -> SerializationError:
    """The error for a value the encoder refused with ``exc`` (None: ``value`` held NaN or an infinity)."""
    if exc is None:
        found = _first(value, _is_non_finite)
        return SerializationError(
            f"{what} cannot be recorded: it {_holds(found, 'NaN or an infinity')}, which JSON cannot represent; "
            "use None or a string for a missing or unbounded number")
    if isinstance(exc, RecursionError):
        return SerializationError(
            f"{what} cannot be recorded: it is nested too deeply to encode (hundreds of levels); "
            "flatten it, e.g. into a list")
    if isinstance(exc, UnicodeEncodeError):
        return SerializationError(
            f"{what} cannot be recorded: it holds a string that is not valid Unicode ({exc.reason}); "
            "decode bytes with errors='replace' or pass them as bytes")
    return SerializationError(f"{what} cannot be recorded ({exc}); {_ADVICE}")


# -- What runifold refuses to record or decode, and what to use instead: the rules of the messages ---------------
# (the generic ones above; these are checked only once a value or an annotation has failed)

_SECRETS = ("the log keeps what it records in clear, so keep secrets out of inputs, results and payloads: pass a "
            "reference to the secret (its name in your secret store) and read the secret in the step that uses it")


def _is_secret(value: Any) -> bool:
    return _is_secret_class(type(value))


def _is_nan(value: Any) -> bool:
    return isinstance(value, decimal.Decimal) and value.is_nan()


#: the most characters an int may take (its digits, and a minus sign): msgspec reads no longer integer back from
#: JSON, whatever ``sys.set_int_max_str_digits`` allows (and Python's own default limit of digits is the same)
MAX_INT_DIGITS = 4_300
_LONGEST = (-(10 ** (MAX_INT_DIGITS - 1)), 10**MAX_INT_DIGITS)  # the ints just too long, below and above


def _is_huge(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and not _LONGEST[0] < value < _LONGEST[1]


def _unrecordable(value: Any) -> str | None:
    """Why ``value`` can never be recorded as it is, and what to use instead; None when no rule here says why.

    A Decimal NaN encodes, but is never equal to itself, so the check that a replay gets back what the live call
    saw cannot pass (a float NaN is refused before: JSON has no such number); a pydantic secret is written
    masked, so it would come back without the secret.
    """
    found = _first(value, _is_nan)
    if found is not None:
        return (f"it {_holds(found, repr(found[0]))}: a NaN is never equal to itself, so runifold could not check that a "
                "replay sees what the live call saw; use None or a string for a missing number")
    found = _first(value, _is_huge)
    if found is not None:
        return (f"it {_holds(found, f'an int of more than {MAX_INT_DIGITS:,} characters (digits and sign)')}, which "
                "runifold cannot read back from the log, whatever sys.set_int_max_str_digits() allows; record it as "
                "a str (str(n)) and convert it where it is used")
    found = _first(value, _is_secret)
    if found is not None:
        return (f"it {_holds(found, f'a pydantic {type(found[0]).__name__}')}, which pydantic writes masked "
                f"('**********'), so the secret would not come back; {_SECRETS}")
    return None


def _holds(found: tuple[Any, str] | None, what: str) -> str:
    """"is <what>" for the value itself, "holds <what> at <path>" for a part of it (found by :func:`_first`)."""
    return f"holds {what} at {found[1]}" if found and found[1] else f"is {what}" if found else f"holds {what}"


def _first(value: Any, test: Callable[[Any], bool]) -> tuple[Any, str] | None:
    """The first part of ``value`` that passes ``test`` with its path (``""`` for ``value`` itself, else such as
    ``['items'][2].price``), or None: itself, or within what the encoder writes of it (the keys and items of builtin
    containers, the fields of Structs, dataclasses and pydantic models)."""
    seen: set[int] = set()

    def walk(v: Any, path: str) -> tuple[Any, str] | None:
        if test(v):
            return v, path
        if id(v) in seen:
            return None
        seen.add(id(v))
        parts: Any
        if isinstance(v, dict):
            parts = [(k, f"{path} (a key)") for k in v] + [(item, f"{path}[{k!r}]") for k, item in v.items()]
        elif isinstance(v, (list, tuple)):
            parts = [(item, f"{path}[{i}]") for i, item in enumerate(v)]
        elif isinstance(v, (set, frozenset)):
            parts = [(item, f"{path} (a member)") for item in v]
        elif isinstance(v, msgspec.Struct):
            parts = [(getattr(v, f, None), f"{path}.{f}") for f in v.__struct_fields__]
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            parts = [(getattr(v, f.name, None), f"{path}.{f.name}") for f in dataclasses.fields(v)]
        elif _is_model(v):
            parts = [(item, f"{path}.{name}") for name, item in vars(v).items()]
        else:
            return None
        return next((found for p, at in parts if (found := walk(p, at)) is not None), None)

    try:
        return walk(value, "")
    except RecursionError:  # nested too deeply to say: the generic message stands
        return None


def _is_model(value: Any) -> bool:
    if "pydantic" not in sys.modules:
        return False
    import pydantic

    return isinstance(value, pydantic.BaseModel)


def _undecodable(type_: Any) -> str | None:
    """Why the annotation ``type_`` cannot be decoded, and what to use instead, when it names a class msgspec
    decodes from no JSON data (its "custom types": ``Counter``, ``Path``, pydantic's ``SecretStr``, ...)."""
    import msgspec.inspect

    try:
        info = msgspec.inspect.type_info(type_)
    except Exception:  # an annotation msgspec cannot even describe: the caller's message stands
        return None
    found: list[type] = []
    seen: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, (list, tuple)):
            for n in node:
                walk(n)
        elif isinstance(node, msgspec.Struct) and id(node) not in seen:
            seen.add(id(node))
            if isinstance(node, msgspec.inspect.CustomType):
                found.append(node.cls)
            else:
                for field in node.__struct_fields__:
                    walk(getattr(node, field))

    walk(info)
    if not found:
        return None
    cls = found[0]
    if issubclass(cls, collections.Counter):
        instead = ("annotate dict[str, int] (a Counter's data: its key type, int counts) and make the Counter where "
                   "you need one")
    elif _is_secret_class(cls):
        instead = _SECRETS
    elif _is_pydantic_model(cls):
        # (a model is decoded by pydantic where the annotation itself holds one; msgspec decodes dataclasses and
        # Structs, and no model inside them)
        instead = (f"a pydantic model inside a dataclass or msgspec.Struct is not decoded: make the outer class a "
                   f"pydantic model too, or {cls.__name__} a dataclass or msgspec.Struct")
    else:
        instead = (f"annotate the JSON form of a {cls.__name__} (a str, a dict, ...), or a dataclass, msgspec.Struct "
                   "or pydantic model holding its data")
    named = f"is {cls.__name__}," if type_ is cls else f"{_spell(type_)} names {cls.__name__},"
    return f"the annotation {named} a class runifold does not decode from JSON data; {instead}"


def _is_pydantic_model(cls: type) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and issubclass(cls, pydantic.BaseModel)


def _is_secret_class(cls: type) -> bool:
    if "pydantic" not in sys.modules:
        return False
    import pydantic

    return issubclass(cls, (pydantic.SecretStr, pydantic.SecretBytes, getattr(pydantic, "Secret", ())))


def _spell(type_: Any) -> str:
    """An annotation as written: ``SecretStr``, ``collections.Counter[str]``."""
    return type_.__name__ if isinstance(type_, type) else repr(type_)


def encode_event(event: AnyEvent) -> bytes:
    """Encode an event as the JSON stored in a row."""
    return encode_value(event, what=lambda: f"event {type(event).__name__} of {event.key or 'the run'}")


def decode_event(raw: bytes | str, *, where: str = "") -> AnyEvent:
    """Decode a stored row; a corrupt row raises ``SerializationError``."""
    try:
        return _event_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise SerializationError(
            f"stored event {where or ''} cannot be decoded ({exc}); the row is corrupt or was "
            "written by a newer runifold: upgrade runifold or restore the row from a backup"
        ) from exc


def to_plain(value: Any, *, what: str) -> Any:
    """Return ``value`` as the JSON builtins a replay will read back, or raise ``SerializationError``."""
    raw = encode_value(value, what=what)
    try:
        return _any_decoder.decode(raw)
    except msgspec.DecodeError as exc:  # written, but not read back (an int of more than MAX_INT_DIGITS digits)
        raise SerializationError(f"{what} cannot be recorded: {_unrecordable(value) or exc}") from exc


def in_one_order(value: Any, *, what: str) -> Any:
    """``value`` as the JSON builtins :func:`to_plain` returns, but with every set's members sorted: a set is
    written in the order of the process's string hashes, so equal values sent from two processes would
    otherwise differ as data. Object keys come sorted too. Members that ``<`` cannot order (plain Enum
    members, mixed types) are ordered by their JSON text, in builtin containers only: inside a dataclass or
    Struct such a set keeps its own order, as does a set in a pydantic model (written as a list by the model
    itself) and a set of frozensets (whose ``<`` is a subset test). Raises ``SerializationError`` as
    :func:`to_plain` does.
    """
    to_plain(value, what=what)  # refused as anywhere else a value is recorded
    return _in_one_order(value)


def _in_one_order(value: Any) -> Any:
    try:
        return _any_decoder.decode(_sorting_encoder.encode(value))
    except TypeError:  # members that `<` cannot order: below, each set's members sorted by their JSON text
        pass
    if isinstance(value, (set, frozenset)):
        return sorted((_in_one_order(m) for m in value), key=canonical)
    if isinstance(value, dict):
        return {_key_text(k): _in_one_order(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_in_one_order(m) for m in value]
    return _any_decoder.decode(_encoder.encode(value))  # (a set inside an object: in its own order)


def _key_text(key: Any) -> str:
    """The JSON object key a dict's ``key`` is written as."""
    text: str = next(iter(_any_decoder.decode(_encoder.encode({key: 0}))))
    return text


def canonical_json(value: Any, *, what: str, one_number: bool = False) -> bytes:
    """``value`` as canonical JSON, to compare or hash: its builtins with object keys and sets' members sorted
    (:func:`in_one_order`), so an equal value gives the same text in every process.

    ``one_number`` writes every integral float as the int it equals (``1.0`` as ``1``, ``-0.0`` as
    ``0``), so values equal as JSON numbers compare equal. Raises ``SerializationError`` as
    :func:`to_plain` does.
    """
    return canonical(in_one_order(value, what=what), one_number=one_number)


def canonical(plain: Any, *, one_number: bool = False) -> bytes:
    """:func:`canonical_json` of a value that is JSON builtins already (what :func:`to_plain` returned)."""
    if one_number:
        # read back with every integral float as the int it equals (by msgspec, which takes any nesting the
        # encoder took: no recursion of Python's)
        plain = _one_number.decode(msgspec.json.encode(plain))
    return msgspec.json.encode(plain, order="sorted")


def _as_one_number(text: str) -> float | int:
    number = float(text)
    return int(number) if number.is_integer() else number


_one_number = msgspec.json.Decoder(float_hook=_as_one_number)


@functools.lru_cache(maxsize=1024)
def _pydantic_adapter(type_: Any) -> Any:
    """A pydantic ``TypeAdapter`` for annotations that involve a pydantic model, else None."""
    if "pydantic" not in sys.modules:
        return None  # no model can be involved: nothing imported pydantic
    import pydantic

    def involves(t: Any) -> bool:
        if isinstance(t, type) and issubclass(t, pydantic.BaseModel):
            return True
        return any(involves(arg) for arg in typing.get_args(t))

    return pydantic.TypeAdapter(type_) if involves(type_) else None


def _to_type(value: Any, type_: Any, strict: bool = False) -> Any:
    """``value`` (JSON builtins) as ``type_``; raises ValueError (msgspec's or pydantic's) when it does not fit.

    A pydantic model validates by pydantic's own rules. Otherwise ``strict`` reads the value as the JSON
    data of ``type_`` and nothing else (``"true"`` is no bool, ``1`` no string; object keys, being strings
    in JSON, may still name ints); lax conversion (for what runifold's own encoder wrote) also parses
    strings as numbers and bools.
    """
    try:
        adapter = _pydantic_adapter(type_) if "pydantic" in sys.modules else None
    except TypeError:  # an unhashable annotation: not a pydantic one
        adapter = None
    except Exception as exc:  # pydantic builds no schema for it (a msgspec Struct beside a model, say): helper-83
        raise UnsupportedTypeError(_pydantic_cannot(type_, exc)) from exc
    try:
        if adapter is not None:
            return adapter.validate_python(value)
        if strict:
            return msgspec.json.decode(msgspec.json.encode(value), type=type_)
        return msgspec.convert(value, type_, strict=False)
    except msgspec.ValidationError as exc:  # "Expected `Counter`, got `dict`": say the class is never decoded
        why = _undecodable(type_)
        if why is not None:
            raise UnsupportedTypeError(why) from exc
        raise
    except TypeError as exc:  # msgspec cannot decode to this annotation at all
        raise UnsupportedTypeError(_cannot_decode(type_, exc)) from exc
    except ValueError:
        raise
    except Exception as exc:  # the class's own code raised building it from the data (a __post_init__, a validator)
        raise ValueError(f"building {_name(type_)} from its data raised {type(exc).__name__}: {exc}") from exc


def _pydantic_cannot(type_: Any, exc: BaseException) -> str:
    return (f"the annotation {_spell(type_)} holds a pydantic model, so pydantic decodes it, and pydantic cannot "
            f"({brief(exc)}); keep the model and the msgspec Struct in separate values, or use dataclasses or "
            "pydantic models throughout")


def _cannot_decode(type_: Any, exc: BaseException) -> str:
    return (f"the annotation {_name(type_)} is not a type runifold can decode ({exc}); for a union of several "
            "dataclasses or Structs use tagged msgspec Structs (tag=True), and give an Enum values of one kind")


def annotation_problem(type_: Any) -> str | None:
    """Why no value at all can be decoded to the annotation ``type_`` (an Enum of mixed values, a union of two
    dataclasses, a pydantic model beside a Struct), or None: checked before a body runs, so a call whose result
    could never be recorded fails before it does anything."""
    if type_ is Any or type_ is typing.NoReturn or type_ is typing.Never:  # (a body that only raises)
        return None
    try:
        if _pydantic_adapter(type_) is not None:
            return None
    except TypeError:  # an unhashable annotation: not a pydantic one
        pass
    except Exception as exc:
        return _pydantic_cannot(type_, exc)
    try:
        msgspec.json.Decoder(type_)
    except TypeError as exc:
        return _cannot_decode(type_, exc)
    except Exception:  # a field annotated with a name Python cannot resolve yet (a class further down): not known
        return None
    return None


class UnsupportedTypeError(ValueError):
    """An annotation msgspec cannot decode to (a union of two dataclasses, an Enum of mixed values, ...)."""


RECORDED = "the type changed incompatibly: register the change as a new version"


def convert(value: Any, type_: Any, *, what: str, advice: str = RECORDED, strict: bool = False) -> Any:
    """Convert JSON builtins to ``type_``: what workflow code receives, live or replayed.

    ``advice`` ends the error's message: what to do about a value that does not fit. The default suits a
    value read back from the log (the code's type changed); data from a sender or an operator says
    what to send instead. ``strict`` is for data that comes from outside (inputs, signal payloads,
    resolutions): see :func:`_to_type`. Such data is decoded on every execution, so it must decode to the same
    value every time: data that leaves out a field whose default is made anew at each decode (a
    ``default_factory`` of ``uuid4`` or ``datetime.now``) is refused, as a replay would see another value.
    """
    if type_ is Any:
        return value
    try:
        converted = _to_type(value, type_, strict)
        if strict:
            first, second = _encoder.encode(converted), _encoder.encode(_to_type(value, type_, strict))
            if first != second:
                raise SerializationError(
                    f"{what} decodes to another value each time (at {_where_differ(first, second)}): the data leaves "
                    f"out a field whose default is made anew (a default_factory such as uuid4 or datetime.now), so "
                    f"a replay would see another value; {advice}, with every such field given")
        return converted
    except UnsupportedTypeError as exc:
        raise SerializationError(f"{what}: {exc}") from exc
    except ValueError as exc:  # msgspec.ValidationError and pydantic.ValidationError are ValueErrors
        raise SerializationError(
            f"{'recorded ' if advice is RECORDED else ''}value of {what} does not fit its annotated type "
            f"{_name(type_)} ({brief(exc)}); {advice}"
        ) from exc


def record(value: Any, type_: Any, *, what: str) -> tuple[Any, Any]:
    """Return ``(plain, live)``: the JSON builtins to record, and what workflow code receives.

    ``live`` is ``convert(plain, type_)``, exactly what a replay of ``plain``
    gives, so live and replayed calls return equal values of one type.

    Raises:
        SerializationError: ``value`` cannot be encoded, does not fit
            ``type_``, or would not come back equal (information would be lost).
    """
    plain = to_plain(value, what=what)
    try:
        live = _to_type(plain, type_) if type_ is not Any else plain
    except UnsupportedTypeError as exc:
        raise SerializationError(f"{what}: {exc}") from exc
    except ValueError as exc:
        raise SerializationError(
            f"{what} returned a {type(value).__name__} that does not fit its annotated type "
            f"{_name(type_)} ({brief(exc)}); return that type or fix the annotation (a class whose own code, a "
            f"__post_init__ or a validator, refuses the data it is recorded as cannot come back either)"
        ) from exc
    if not _same(live, value):
        why = _unrecordable(value)
        if why is not None:
            raise SerializationError(f"{what} cannot be recorded: {why}")
        if type_ is not Any:
            hint = f"return a value of type {_name(type_)} that compares equal after a JSON round trip"
        elif isinstance(value, dict) and any(not isinstance(k, str) for k in value):
            hint = "JSON object keys are strings: annotate the key type (e.g. -> dict[int, str]) or use string keys"
        else:
            hint = (f"annotate the return type (e.g. -> {type(value).__name__}) or return plain JSON data (an "
                    "annotation Python cannot resolve when the code runs, such as a type imported only under "
                    "TYPE_CHECKING, counts as none)")
        where, part = _where_unlike(live, value, "")
        raise SerializationError(
            f"{what} returned {_describe(value)}, which would come back from the log as "
            f"{_describe(live)}{f' (at {where}: {_describe(part)})' if where else ''}; a replay must see what the "
            f"live call saw: {hint}"
        )
    return plain, live


def accept(value: Any, type_: Any, *, what: str) -> tuple[Any, Any]:
    """Like :func:`record`, for a value that arrives as data rather than from code: an operator's
    resolution, a reconcile function's evidence. It is read as its JSON data of ``type_`` first (a dict
    for a model, a list for a tuple), then recorded exactly.

    Raises:
        SerializationError: it cannot be encoded, or its data does not fit ``type_``.
    """
    if type_ is Any:
        return record(value, type_, what=what)
    advice = f"give JSON data of type {_name(type_)}"
    return record(convert(to_plain(value, what=what), type_, what=what, advice=advice, strict=True), type_, what=what)


def brief(exc: BaseException) -> str:
    """A validation error in one line: pydantic's field by field, msgspec's as it is."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in errors())[:300]
        except Exception:  # not pydantic's errors(): fall back to the message
            pass
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _same(live: Any, value: Any) -> bool:
    """``live`` (the value decoded from the log) equals ``value`` (what the call returned), a datetime of a zone
    counting as equal to the same wall time at the same UTC offset.

    Python never compares a datetime in a zone's repeated or skipped hour (when clocks go back or forward)
    equal to one of another tzinfo (PEP 495), although the log keeps its wall time and offset, and so its
    instant: such a datetime, alone or inside a dict (as a key too), list, tuple, set, dataclass, Struct or
    pydantic model, is compared by its ISO text (the recorded form) instead. Anything else is compared by ``==``.
    """
    try:
        if live == value:
            return True
    except Exception:  # a value whose == raises (arrays, ...) cannot be checked, so not trusted
        return False
    if type(live) is not type(value):
        return False
    if isinstance(value, datetime.datetime):
        return value.tzinfo is not None and live.isoformat() == value.isoformat()
    if isinstance(value, (set, frozenset, dict)):
        # hashed members (a set's, a dict's keys) are paired by their recorded text
        ours, theirs = _by_text(live), _by_text(value)
        if ours is None or theirs is None or ours.keys() != theirs.keys() or len(theirs) != len(value) \
                or len(ours) != len(live):
            return False  # (two members of one text: not told apart)
        pairs = [(ours[t], theirs[t]) for t in theirs]
        return all(_same(a, b) and (not isinstance(value, dict) or _same(live[a], value[b])) for a, b in pairs)
    if isinstance(value, (list, tuple)):
        return len(live) == len(value) and all(_same(a, b) for a, b in zip(live, value, strict=True))
    if dataclasses.is_dataclass(value) and getattr(value, "__dataclass_params__").eq:  # noqa: B009
        return all(_same(getattr(live, f.name), getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, msgspec.Struct) and value.__struct_config__.eq:
        return all(_same(getattr(live, f), getattr(value, f)) for f in value.__struct_fields__)
    fields = getattr(type(value), "model_fields", None)  # a pydantic model (compared by its fields, as == does)
    if isinstance(fields, dict) and "pydantic" in sys.modules:
        import pydantic

        if isinstance(value, pydantic.BaseModel):
            return all(_same(getattr(live, f), getattr(value, f)) for f in fields) and (
                live.__pydantic_extra__ == value.__pydantic_extra__)
    return False


def _where_unlike(live: Any, value: Any, path: str) -> tuple[str, Any]:
    """The path of the first part where ``live`` (decoded from the log) is not :func:`_same` as ``value``, with that
    part of ``value``: within lists, tuples, dicts (walked in order, as the log keeps them), dataclasses and Structs
    of one type; ``path`` itself where it cannot tell (or the difference is the part's own type)."""
    if type(live) is not type(value):
        return path, value
    pairs: list[tuple[Any, Any, str]] = []
    if isinstance(value, (list, tuple)) and len(live) == len(value):
        pairs = [(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(live, value, strict=True))]
    elif isinstance(value, dict) and len(live) == len(value):
        for (lk, lv), (k, v) in zip(live.items(), value.items(), strict=True):
            if not _same(lk, k):
                return f"{path} (a key)".strip(), k
            pairs.append((lv, v, f"{path}[{k!r}]"))
    elif dataclasses.is_dataclass(value) or isinstance(value, msgspec.Struct):
        names = value.__struct_fields__ if isinstance(value, msgspec.Struct) else [
            f.name for f in dataclasses.fields(value)]
        pairs = [(getattr(live, n, None), getattr(value, n, None), f"{path}.{n}") for n in names]
    return next((_where_unlike(a, b, at) for a, b, at in pairs if not _same(a, b)), (path, value))


def _by_text(members: Any) -> dict[bytes, Any] | None:
    """A set's members (a dict's keys) by their recorded text; None when one cannot be recorded."""
    try:
        return {canonical_json(m, what="a member"): m for m in members}
    except SerializationError:
        return None


def _where_differ(a: bytes, b: bytes) -> str:
    """Where two JSON documents first differ: a path such as ``request_id`` or ``items[2].id`` (never the
    values, which differ from one decode to the next)."""
    def walk(x: Any, y: Any, path: str) -> str | None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in x:
                found = walk(x[k], y.get(k), f"{path}.{k}" if path else str(k))
                if found is not None:
                    return found
            return None
        if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            return next((f for i, (u, v) in enumerate(zip(x, y)) if (f := walk(u, v, f"{path}[{i}]")) is not None),
                        None)
        return None if x == y else (path or "the value")

    return walk(_any_decoder.decode(a), _any_decoder.decode(b), "") or "the value"


def _name(type_: Any) -> str:
    return getattr(type_, "__name__", None) or repr(type_)


def _describe(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # (a class whose __repr__ raises: the value is still refused, saying so)
        text = f"<its repr raised {type(exc).__name__}>"
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
