"""Values and exceptions of ordinary workflow code that broke the promise (helper-22), on every store."""

from __future__ import annotations

import asyncio
import decimal
import dataclasses
import enum
import os
import pathlib
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import msgspec
import pydantic
import pytest

from runifold import (
    Completed,
    ConfigurationError,
    Failed,
    InvalidInputError,
    ResumePolicy,
    RetryPolicy,
    SerializationError,
    StepFailedError,
    Suspended,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    effect,
    step,
    workflow,
)
from runifold.history import StepFailed
from tests.corpus.check import replay_problems
from tests.support import entries, event_types, send_signal, until_completed, worker

ran: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


# -- data from outside whose default is made anew at each decode -------------------------------------------


@dataclasses.dataclass
class Order:
    order_id: str
    request_id: uuid.UUID = dataclasses.field(default_factory=uuid.uuid4)


@step()
async def charge(order_id: str, request_id: uuid.UUID) -> str:
    ran[order_id] += 1
    return f"{order_id}:{request_id}"


@workflow("takes-an-order")
async def takes_an_order(ctx: WorkflowContext, order: Order) -> str:
    charged = await charge(order.order_id, order.request_id)
    await ctx.sleep(timedelta(milliseconds=10))
    return charged


@workflow("approves-an-order")
async def approves_an_order(ctx: WorkflowContext) -> str:
    try:
        order = await ctx.wait_signal("order", type=Order)
    except SerializationError as exc:
        return str(exc)
    return await charge(order.order_id, order.request_id)


async def test_data_whose_default_is_made_anew_at_each_decode_is_refused(store: Any) -> None:
    """An input or a signal payload that leaves out a field with a default_factory (uuid4) decoded to another
    value at every execution: the step was charged with one request id and the run completed with another, and
    the completed run diverged on replay. Now the input is refused at the check (and by the run, unchecked), the
    payload at the wait; a full value (the caller's own instance, dumped) is taken."""
    registry = WorkflowRegistry(WorkflowDefinition(takes_an_order), WorkflowDefinition(approves_an_order,
                                                                                         signals={"order": {"*"}}))
    defs = [registry.definition_for(n, v) for n, v in registry.versions()]
    partial = WorkflowTask("takes-an-order", 1, {"order": {"order_id": "o-1"}}, checkpoint_id="o1")
    with pytest.raises(InvalidInputError, match=r"parameter 'order' decodes to another value each time \(at "
                                                r"request_id\): the data leaves out a field whose default is made anew"):
        registry.validate(partial)
    await store.enqueue(partial)  # unchecked: the run refuses it at its first execution, before any step
    failed = await worker(store, *defs).run_once()
    assert isinstance(failed, Failed) and failed.run_failed and "decodes to another value each time" in failed.reason
    assert ran == Counter()

    full = {"order": {"order_id": "o-2", "request_id": str(uuid.uuid4())}}
    await store.enqueue(registry.validate(WorkflowTask("takes-an-order", 1, full, checkpoint_id="o2")))
    done = await until_completed(store, *defs)
    assert done.output == f"o-2:{full['order']['request_id']}"
    assert not await replay_problems(store, registry, "o2", done.output)

    await store.enqueue(WorkflowTask("approves-an-order", 1, {}, checkpoint_id="a1"))
    assert isinstance(await worker(store, *defs).run_once(), Suspended)
    await send_signal(store, "a1", "order", "s1", {"order_id": "o-3"})
    done = await worker(store, *defs).run_once()
    assert isinstance(done, Completed) and "decodes to another value each time (at request_id)" in done.output
    assert ran == Counter({"o-2": 1})
    assert not await replay_problems(store, registry, "a1", done.output)


# -- pydantic models with aliases --------------------------------------------------------------------------


class Invoice(pydantic.BaseModel):
    order_id: str = pydantic.Field(alias="orderId")
    total_cents: int = pydantic.Field(alias="totalCents")


@step()
async def fetch_invoice(order_id: str) -> Invoice:
    return Invoice(orderId=order_id, totalCents=990)


@workflow("invoiced")
async def invoiced(ctx: WorkflowContext, invoice: Invoice) -> Invoice:
    fetched = await fetch_invoice(invoice.order_id)
    await ctx.sleep(timedelta(milliseconds=10))
    return Invoice(orderId=fetched.order_id, totalCents=fetched.total_cents + invoice.total_cents)


async def test_a_pydantic_model_with_aliases_round_trips(store: Any) -> None:
    """Models were dumped by field name and validated by alias, so a step returning one was refused ("Field
    required") and a model instance as input failed the run."""
    definition = WorkflowDefinition(invoiced)
    task = WorkflowRegistry(definition).validate(
        WorkflowTask("invoiced", 1, {"invoice": Invoice(orderId="o-1", totalCents=10)}, checkpoint_id="i1"))
    await store.enqueue(task)
    done = await until_completed(store, definition)
    assert done.output == Invoice(orderId="o-1", totalCents=1000)
    assert not await replay_problems(store, WorkflowRegistry(definition), "i1", done.output)


# -- exceptions --------------------------------------------------------------------------------------------


@step(retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
async def rejects_upload(name: bytes) -> str:
    raise ValueError(f"not a CSV file: {os.fsdecode(name)}")


@workflow("uploads")
async def uploads(ctx: WorkflowContext) -> str:
    try:
        return await rejects_upload(b"photo\xff.png")
    except StepFailedError as exc:
        return f"rejected: {exc.error}"


async def test_an_exception_message_that_is_not_valid_unicode_is_a_step_failure(store: Any) -> None:
    """A step raising an error whose text holds a lone surrogate (os.fsdecode of undecodable bytes) failed the
    whole run as an unrecordable event: no retry, and the workflow's ``except StepFailedError`` never ran. The
    text is recorded with the surrogate escaped."""
    definition = WorkflowDefinition(uploads)
    await store.enqueue(WorkflowTask("uploads", 1, {}, checkpoint_id="u1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "rejected: ValueError: not a CSV file: photo\\udcff.png"
    assert await event_types(store, "u1") == ["run_started", "step_failed", "step_failed", "run_completed"]
    assert not await replay_problems(store, WorkflowRegistry(definition), "u1", done.output)


class Abort(BaseException):
    pass


@step(retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
async def exits(how: str) -> str:
    ran[how] += 1
    if how == "exit":
        sys.exit(3)  # a command-line library used inside a step
    raise Abort("stop everything")


@step(retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
def interrupted() -> str:  # a plain def step: runs in a thread
    ran["interrupt"] += 1
    raise KeyboardInterrupt


@workflow("exits")
async def exits_workflow(ctx: WorkflowContext) -> list[str]:
    async def caught(call: Any) -> str:
        try:
            return await call
        except StepFailedError as exc:
            return exc.error_type

    alone = await caught(exits("exit"))  # the only call in flight: the driver awaits its body itself
    together = await asyncio.gather(caught(exits("abort")), caught(interrupted()))  # bodies as tasks
    return [alone, *together]


async def test_a_base_exception_raised_by_a_body_fails_its_attempt_not_the_worker(store: Any) -> None:
    """sys.exit in a step ended the worker process (asyncio lets SystemExit out of its loop), and a BaseException
    of the code's own left the run recovering lease after lease. Each now fails its attempt, is retried by the
    step's policy, and reaches the workflow as StepFailedError."""
    definition = WorkflowDefinition(exits_workflow)
    await store.enqueue(WorkflowTask("exits", 1, {}, checkpoint_id="e1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed)
    assert done.output == ["SystemExit", f"{__name__}.Abort", "KeyboardInterrupt"]
    assert ran == Counter({"exit": 2, "abort": 2, "interrupt": 2})
    failures = [e.event for e in await entries(store, "e1") if isinstance(e.event, StepFailed)]
    assert len(failures) == 6 and all(f.traceback for f in failures)
    assert not await replay_problems(store, WorkflowRegistry(definition), "e1", done.output)


# -- annotations the codec cannot decode to ---------------------------------------------------------------


@step()
async def payment_method(kind: str) -> CardOrIban:  # (a name Python resolves only when the step is first called)
    ran["payment_method"] += 1
    return Card("4242") if kind == "card" else Iban("DE00")


@dataclasses.dataclass
class Card:
    number: str


@dataclasses.dataclass
class Iban:
    iban: str


CardOrIban = Card | Iban


class Mixed(enum.Enum):
    CASH = "cash"
    CHEQUE = 2


async def outcome_text(call: Callable[[], Awaitable[Any]]) -> str:
    """What a step call gave, as text: its result, the error text of its failure, or why it was refused."""
    try:
        return str(await call())
    except StepFailedError as exc:
        return exc.error
    except SerializationError as exc:  # refused at the call
        return f"refused: {exc}"


@workflow("pays")
async def pays(ctx: WorkflowContext) -> str:
    try:
        return str(await payment_method("card"))
    except SerializationError as exc:
        return f"refused at the call: {exc}"


def test_an_annotation_no_value_decodes_to_is_refused_when_the_call_is_declared() -> None:
    """helper-88: an Enum of str and int values was refused only when a result was recorded, after the body ran
    (an effect's too, whose body had charged)."""
    def declared(decorate: Any, fn: Any) -> str:
        with pytest.raises(ConfigurationError) as caught:
            decorate(fn)
        return str(caught.value)

    async def cash() -> Mixed:
        return Mixed.CASH

    async def card(key: str) -> Card | Iban:
        return Card(key)

    async def takes(ctx: WorkflowContext, how: Mixed) -> str:
        return "paid"

    assert declared(step(), cash).startswith(
        "step 'cash' cannot return a value runifold records: the annotation Mixed is not a type runifold can decode "
        "(Enums must contain either all str or all int values")
    assert declared(effect(resume=ResumePolicy.REPEAT), card).startswith("effect 'card' cannot return a value runifold records: the annotation")
    assert "Type unions may not contain more than one dataclass" in declared(effect(resume=ResumePolicy.REPEAT), card)
    assert declared(workflow("takes"), takes).startswith("workflow 'takes' cannot take its parameter 'how': ")


async def test_an_annotation_resolved_only_at_the_call_is_refused_there_before_the_body_runs(store: Any) -> None:
    """A union of two dataclasses raised msgspec's TypeError out of the driver: the worker logged an unexpected
    error and the run recovered lease after lease until its recovery budget ran out. Then the step failed once its
    body had run; now the call raises SerializationError before it does anything, live and replayed alike."""
    await store.enqueue(WorkflowTask("pays", 1, {}, checkpoint_id="p1"))
    done = await worker(store, WorkflowDefinition(pays)).run_once()
    assert isinstance(done, Completed)
    assert done.output.startswith("refused at the call: payment_method cannot return a value runifold records: the "
                                  "annotation")
    assert "is not a type runifold can decode (Type unions may not contain more than one" in done.output
    assert "use tagged msgspec Structs (tag=True)" in done.output
    assert ran["payment_method"] == 0
    assert await event_types(store, done.run_id) == ["run_started", "run_completed"]


@dataclasses.dataclass
class Basket:
    items: list[Item]  # (a class further down: not resolvable when the step below is declared)


@step()
async def fill_basket() -> Basket:
    return Basket([Item("a")])


@workflow("pays-later")
async def pays_later(ctx: WorkflowContext) -> CardOrIbanLater:  # (resolved only when it is started or ends)
    ran["pays_later"] += 1
    return Card("4242")


@dataclasses.dataclass
class Item:
    sku: str


CardOrIbanLater = Card | Iban


@workflow("fills-and-starts")
async def fills_and_starts(ctx: WorkflowContext) -> list[str]:
    said = [repr(await fill_basket())]
    try:
        await ctx.start_child(pays_later)
    except SerializationError as exc:
        said.append(f"refused: {exc}")
    return said


async def test_a_field_naming_a_class_further_down_is_no_refusal_and_a_child_refused_is_never_started(
        store: Any) -> None:
    """helper-99: a dataclass whose field names a class defined further down made the module fail to import
    (msgspec raised NameError, which the declaration check let out); and a child workflow whose result no value
    decodes to was started, and its body ran, while its parent was told the start was refused."""
    await store.enqueue(WorkflowTask("fills-and-starts", 1, {}, checkpoint_id="fs1"))
    done = await worker(store, WorkflowDefinition(fills_and_starts), WorkflowDefinition(pays_later)).run_once()
    assert isinstance(done, Completed), done
    basket, refused = done.output
    assert basket == "Basket(items=[Item(sku='a')])"
    assert refused.startswith("refused: pays_later cannot return a value runifold records: the annotation"), refused
    assert [r.checkpoint_id for r in await store.list_runs()] == ["fs1"] and ran["pays_later"] == 0


class Sku(msgspec.Struct, frozen=True):
    code: str


class Price(pydantic.BaseModel):
    cents: int


@dataclasses.dataclass
class Reading:
    value: int

    def __post_init__(self) -> None:
        if self.value > 100:
            raise RuntimeError("sensor out of range")  # neither ValueError nor TypeError


bodies: Counter[str] = Counter()


@step()
async def sku_and_price() -> SkuAndPrice:  # (resolved at the call: refused there, before the body runs)
    bodies["sku_and_price"] += 1
    return Sku("a"), Price(cents=1)


SkuAndPrice = tuple[Sku, Price]


@step()
async def reading() -> Reading:
    bodies["reading"] += 1
    made = object.__new__(Reading)  # (built by a library that skips __init__)
    made.value = 500
    return made


@workflow("decodes-with-user-code")
async def decodes_with_user_code(ctx: WorkflowContext) -> list[str]:
    return [await outcome_text(call) for call in (sku_and_price, reading)]


async def test_a_decoder_that_raises_fails_the_step_saying_so_and_never_the_worker(store: Any) -> None:
    """helper-83: a tuple of a msgspec Struct and a pydantic model made pydantic raise its schema error out of the
    codec, and a dataclass whose __post_init__ raised RuntimeError as it was rebuilt did the same: the worker logged
    an unexpected error, the run was recovered lease after lease, the step's body ran again at each recovery until
    the recovery budget failed the run. Each step now fails for good, once, saying why."""
    bodies.clear()
    await store.enqueue(WorkflowTask("decodes-with-user-code", 1, {}, checkpoint_id="d1"))
    done = await worker(store, WorkflowDefinition(decodes_with_user_code)).run_once()
    assert isinstance(done, Completed), done
    mixed, post_init = done.output
    assert mixed.startswith("refused: sku_and_price cannot return a value runifold records: the annotation tuple[") and (
        "holds a pydantic model, so pydantic decodes it, and pydantic cannot" in mixed), mixed
    assert post_init.startswith("SerializationError: step reading#1 returned a Reading that does not fit") and (
        "building Reading from its data raised RuntimeError: sensor out of range" in post_init), post_init
    assert bodies == {"reading": 1}


@dataclasses.dataclass
class Opaque:
    n: int

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__ raised")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ raised")


@step()
async def opaque() -> Opaque:
    bodies["opaque"] += 1
    return Opaque(1)


@workflow("returns-opaque")
async def returns_opaque(ctx: WorkflowContext) -> str:
    return await outcome_text(opaque)


async def test_a_result_whose_eq_and_repr_raise_fails_its_step_once(store: Any) -> None:
    """helper-86: the refusal's message called repr() of the value, which raised out of the engine: the body ran
    again at every recovery. It is refused once, saying its repr could not be read."""
    bodies.clear()
    await store.enqueue(WorkflowTask("returns-opaque", 1, {}, checkpoint_id="q1"))
    done = await worker(store, WorkflowDefinition(returns_opaque)).run_once()
    assert isinstance(done, Completed) and "<its repr raised RuntimeError>" in done.output, done
    assert bodies == {"opaque": 1}


class Wrapped(msgspec.Struct):
    price: Price


@step()
async def wrapped() -> Wrapped:
    return Wrapped(Price(cents=1))


@workflow("model-in-a-struct")
async def model_in_a_struct(ctx: WorkflowContext) -> str:
    return await outcome_text(wrapped)


async def test_a_pydantic_model_inside_a_struct_is_refused_saying_what_to_do(store: Any) -> None:
    """helper-83: the refusal told the user to use a pydantic model, which the field already was."""
    await store.enqueue(WorkflowTask("model-in-a-struct", 1, {}, checkpoint_id="m1"))
    done = await worker(store, WorkflowDefinition(model_in_a_struct)).run_once()
    assert isinstance(done, Completed)
    assert ("a pydantic model inside a dataclass or msgspec.Struct is not decoded: make the outer class a pydantic "
            "model too, or Price a dataclass or msgspec.Struct") in done.output, done.output


@step()
async def card_typed_elsewhere() -> "ImportedOnlyForTypeChecking":  # type: ignore[name-defined]  # noqa: F821
    return Card("4242")


@workflow("annotated-elsewhere")
async def annotated_elsewhere(ctx: WorkflowContext) -> str:
    return await outcome_text(card_typed_elsewhere)


async def test_an_annotation_that_cannot_be_resolved_is_named_in_the_refusal(store: Any) -> None:
    """A return type imported only under TYPE_CHECKING cannot be resolved when the code runs, so the step counts
    as unannotated; the refusal said "annotate the return type" of a step that is annotated (helper-22)."""
    await store.enqueue(WorkflowTask("annotated-elsewhere", 1, {}, checkpoint_id="ae1"))
    done = await worker(store, WorkflowDefinition(annotated_elsewhere)).run_once()
    assert isinstance(done, Completed)
    assert "an annotation Python cannot resolve when the code runs, such as a type imported only under " \
           "TYPE_CHECKING, counts as none" in done.output


# -- refusals that read as contradictions (helper-31) --------------------------------------------------------


class Credentials(pydantic.BaseModel):
    user: str
    password: pydantic.SecretStr


@step()
async def word_counts() -> Counter[str]:
    return Counter("abca")


@step()
async def measured() -> decimal.Decimal:
    return decimal.Decimal("NaN")


@step()
async def measured_unannotated():  # type: ignore[no-untyped-def]
    return [decimal.Decimal("1.5"), decimal.Decimal("NaN")]


@step()
async def api_token() -> pydantic.SecretStr:
    return pydantic.SecretStr("hunter2")


@step()
async def signed_in() -> Credentials:
    return Credentials(user="ada", password=pydantic.SecretStr("hunter2"))


@step()
async def keyed_by_flag():  # type: ignore[no-untyped-def]
    return {True: 1, False: 0}


@step()
async def where_it_is() -> pathlib.Path:
    return pathlib.Path("/srv/report.pdf")


REFUSED = {"where_it_is": where_it_is, "word_counts": word_counts, "measured": measured, "measured_unannotated": measured_unannotated,
           "api_token": api_token, "signed_in": signed_in, "keyed_by_flag": keyed_by_flag}
ADVICE = ("use JSON-compatible data (dict, list, str, int, float, bool, None), a msgspec.Struct, a dataclass or a "
          "pydantic model (datetime, UUID, tuple, set, bytes and Decimal are recorded where the type is annotated as "
          "such; anything else, e.g. a Path, as str or the like), and keep large artifacts outside the log, referenced "
          "by id")
NAN = ("a NaN is never equal to itself, so runifold could not check that a replay sees what the live call saw; "
       "use None or a string for a missing number")
SECRETS = ("the log keeps what it records in clear, so keep secrets out of inputs, results and payloads: pass a "
           "reference to the secret (its name in your secret store) and read the secret in the step that uses it")


@workflow("refused")
async def refused(ctx: WorkflowContext, name: str) -> str:
    return await outcome_text(REFUSED[name])


@workflow("counted")
async def counted(ctx: WorkflowContext, counts: Counter[str]) -> int:
    return len(counts)


@workflow("signs-in")
async def signs_in(ctx: WorkflowContext, token: pydantic.SecretStr) -> int:
    return 1


async def test_a_refused_value_or_annotation_says_what_is_wrong_and_what_to_use(store: Any) -> None:
    """Found by helper-31: a Counter "did not fit its annotated type Counter", a Decimal NaN "would come back from
    the log as" the same NaN (and unannotated, was told to annotate Decimal, which fails the same), a SecretStr
    was told to annotate its type (it was), and a model holding one "would come back as" the same masked model.
    Each refusal now says what is wrong and what to use."""
    said = {
        "word_counts": "SerializationError: step word_counts#1: the annotation collections.Counter[str] names "
                       "Counter, a class runifold does not decode from JSON data; annotate dict[str, int] "
                       "(a Counter's data: its key type, int counts) and make the Counter where you need one",
        "measured": f"SerializationError: step measured#1 cannot be recorded: it is Decimal('NaN'): {NAN}",
        "measured_unannotated": "SerializationError: step measured_unannotated#1 cannot be recorded: it holds "
                                f"Decimal('NaN') at [1]: {NAN}",
        "api_token": "SerializationError: step api_token#1 cannot be recorded: it is a pydantic SecretStr, which "
                     f"pydantic writes masked ('**********'), so the secret would not come back; {SECRETS}",
        "signed_in": "SerializationError: step signed_in#1 cannot be recorded: it holds a pydantic SecretStr at "
                     ".password, which "
                     f"pydantic writes masked ('**********'), so the secret would not come back; {SECRETS}",
        "where_it_is": "SerializationError: step where_it_is#1 cannot be recorded (PosixPath is not "
                       "JSON-serialisable); " + ADVICE,  # it said to annotate the type, which it was
        "keyed_by_flag": "SerializationError: step keyed_by_flag#1 cannot be recorded (a bool cannot be the key of "
                         "a dict (JSON object keys are strings): use str, int, float, Enum, UUID, date, datetime or "
                         "Decimal keys); " + ADVICE,
    }
    definition = WorkflowDefinition(refused)
    for name, message in said.items():
        await store.enqueue(WorkflowTask("refused", 1, {"name": name}, checkpoint_id=name))
        done = await worker(store, definition).run_once()
        assert isinstance(done, Completed) and done.output == message, (name, done)
    registry = WorkflowRegistry(WorkflowDefinition(counted), WorkflowDefinition(signs_in))
    with pytest.raises(InvalidInputError) as counts_refused:
        registry.validate(WorkflowTask("counted", 1, {"counts": {"a": 2}}))
    assert str(counts_refused.value) == (
        "input for workflow 'counted' v1: parameter 'counts': the annotation collections.Counter[str] names Counter, "
        "a class runifold does not decode from JSON data; annotate dict[str, int] (a Counter's data: its key type, "
        "int counts) and make the Counter where you need one")
    with pytest.raises(InvalidInputError) as token_refused:
        registry.validate(WorkflowTask("signs-in", 1, {"token": "hunter2"}))
    assert str(token_refused.value) == (
        f"input for workflow 'signs-in' v1: parameter 'token': the annotation is SecretStr, a class runifold does not "
        f"decode from JSON data; {SECRETS}")


class OrderNumber(str):
    """A str of the application's own (found by helper-53: refused as "not JSON-serialisable", though a str)."""


class Cents(int):
    pass


@step()
async def numbered() -> str:
    return OrderNumber("A-1")


@step()
async def priced():  # type: ignore[no-untyped-def]
    return {"total": Cents(250), "label": OrderNumber("B-2")}


@workflow("subclassed")
async def subclassed(ctx: WorkflowContext) -> list[str]:
    number, price = await numbered(), await priced()
    await ctx.sleep(timedelta(milliseconds=20))  # the next execution replays both
    return [type(number).__name__, number, type(price["total"]).__name__, repr(price)]


async def test_a_subclass_of_str_or_int_is_recorded_as_that_type(store: Any) -> None:
    """A value of a subclass of str, int or float is recorded as the builtin it is, and comes back as that
    builtin, live and replayed alike (it compares equal)."""
    definition = WorkflowDefinition(subclassed)
    await store.enqueue(WorkflowTask("subclassed", 1, {}, checkpoint_id="sub1"))
    done = await until_completed(store, definition)
    assert done.output == ["str", "A-1", "int", "{'total': 250, 'label': 'B-2'}"]
    assert not await replay_problems(store, WorkflowRegistry(definition), "sub1", done.output)


# -- an error's text is bounded -----------------------------------------------------------------------------------


@step(retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
async def says_a_lot() -> str:
    raise ValueError("x" * 3_000_000)


@workflow("says-a-lot")
async def says_a_lot_wf(ctx: WorkflowContext) -> str:
    try:
        return await says_a_lot()
    except StepFailedError as exc:
        return exc.error


async def test_a_long_error_text_is_recorded_up_to_its_bound_and_said_so(store: Any) -> None:
    """helper-95: a 3 MB exception message was written whole into each failed attempt and into the run's reason.
    The text keeps its first 8,000 characters and says how long it was; the workflow gets the text recorded."""
    await store.enqueue(WorkflowTask("says-a-lot", 1, {}, checkpoint_id="long1"))
    done = await until_completed(store, WorkflowDefinition(says_a_lot_wf))
    assert done.output == "ValueError: " + "x" * 7_988 + "... [3,000,012 characters; the rest is not recorded]"
    assert max(len(e.body) for e in await store.history("long1")) < 16_000  # (the text and a bounded traceback)
