"""The task registry: registering, looking up, validating calls, autodiscovery and TaskContext."""

from __future__ import annotations

import threading

import pytest

from jobs import registry
from jobs.registry import (
    ERR_UNKNOWN_TASK,
    TRUNCATION_MARKER,
    DuplicateTask,
    TaskArgumentError,
    TaskContext,
    TaskError,
    TaskSpec,
    UnknownTask,
    get_task,
    is_registered,
    task,
    task_names,
    validate_task_call,
)

BUILTINS = {"noop", "sleep", "log", "http_request", "management_command", "purge_runs"}


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, TaskSpec]:
    """A private copy of the registry (built-ins included) for the length of one test."""
    copy = dict(registry._registry)
    monkeypatch.setattr(registry, "_registry", copy)
    return copy


def make_context(**overrides) -> TaskContext:
    values = {"execution_id": 1, "job_name": "job", "attempt": 1, "scheduled_for": None}
    values.update(overrides)
    return TaskContext(**values)


# --- registering and looking up ------------------------------------------------------------------


def test_register_and_lookup(isolated_registry):
    def check(args, kwargs):
        return None

    @task("tests.add", validate=check)
    def add(a, b=1):
        """Add two numbers.

        More detail that is not part of the description.
        """
        return a + b

    spec = get_task("tests.add")
    assert isinstance(spec, TaskSpec)
    assert spec.name == "tests.add"
    assert spec.func is add
    assert spec.description == "Add two numbers."
    assert spec.takes_context is False
    assert spec.validate is check
    assert add(2, 3) == 5  # the decorator returns the function unchanged
    assert is_registered("tests.add")
    assert "tests.add" in task_names()


def test_spec_is_frozen(isolated_registry):
    @task("tests.frozen")
    def frozen():
        pass

    with pytest.raises(AttributeError):
        get_task("tests.frozen").name = "other"


def test_default_name_is_module_and_qualname(isolated_registry):
    @task()
    def defaulted():
        pass

    name = f"{__name__}.test_default_name_is_module_and_qualname.<locals>.defaulted"
    assert get_task(name).func is defaulted
    assert get_task(name).description == ""


def test_bare_decorator(isolated_registry):
    @task
    def bare():
        """Bare."""

    assert get_task(f"{__name__}.{bare.__qualname__}").func is bare


def test_task_names_sorted(isolated_registry):
    for name in ("tests.zz", "tests.aa", "tests.mm"):
        task(name)(lambda: None)
    names = task_names()
    assert names == sorted(names)
    assert {"tests.zz", "tests.aa", "tests.mm"} <= set(names)


def test_unknown_task(isolated_registry):
    with pytest.raises(UnknownTask) as excinfo:
        get_task("no.such.task")
    assert isinstance(excinfo.value, TaskError)
    assert excinfo.value.name == "no.such.task"
    message = str(excinfo.value)
    assert message.startswith("unknown task 'no.such.task'; registered tasks: ")
    # The first names in order (which ones depends on what else the session registered).
    first = sorted(task_names())[:2]
    assert all(f"'{name}'" in message for name in first), message
    assert not is_registered("no.such.task")
    assert (
        ERR_UNKNOWN_TASK.format(name="x", known="'a'") == "unknown task 'x'; registered tasks: 'a'"
    )


def test_unknown_task_lists_only_a_few(isolated_registry):
    for index in range(30):
        task(f"tests.many{index:02d}")(lambda: None)
    message = str(UnknownTask("nope"))
    assert message.count("'tests.many") < 30
    assert f"({len(task_names())} in all)" in message


def test_unknown_task_when_registry_empty(monkeypatch):
    monkeypatch.setattr(registry, "_registry", {})
    with pytest.raises(UnknownTask, match=r"registered tasks: \(none\)"):
        get_task("noop")


def test_duplicate_name_refused(isolated_registry):
    @task("tests.dup")
    def first():
        pass

    def second():
        pass

    with pytest.raises(DuplicateTask, match=r"tests\.dup"):
        task("tests.dup")(second)
    assert get_task("tests.dup").func is first


def test_reregistering_same_function_is_noop(isolated_registry):
    def once():
        pass

    task("tests.once")(once)
    spec = get_task("tests.once")
    assert task("tests.once")(once) is once
    assert get_task("tests.once") is spec


def test_reload_replaces_same_definition(isolated_registry):
    """A module reload re-creates the function (same module and qualname): no DuplicateTask."""

    def make():
        def reloaded():
            pass

        reloaded.__module__ = "tests.fake_module"
        reloaded.__qualname__ = "reloaded"
        return reloaded

    old, new = make(), make()
    task("tests.reloaded")(old)
    task("tests.reloaded")(new)
    assert get_task("tests.reloaded").func is new


def test_takes_context_needs_context_parameter(isolated_registry):
    def no_context(x):
        pass

    with pytest.raises(TypeError, match="context"):
        task("tests.nocontext", takes_context=True)(no_context)
    assert not is_registered("tests.nocontext")


def test_concurrent_registration_is_safe(isolated_registry):
    errors: list[BaseException] = []

    def register(index: int) -> None:
        try:
            task(f"tests.thread{index}")(lambda: None)
        except BaseException as exc:  # pragma: no cover - a failure is reported below
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert all(is_registered(f"tests.thread{i}") for i in range(50))


# --- validate_task_call --------------------------------------------------------------------------


@pytest.fixture
def two_args_task(isolated_registry):
    @task("tests.two")
    def two(a, b, c=3):
        return a + b + c

    return two


def test_valid_calls_pass(two_args_task):
    assert validate_task_call("tests.two", [1, 2], {}) is None
    validate_task_call("tests.two", [1], {"b": 2})
    validate_task_call("tests.two", [], {"a": 1, "b": 2, "c": 3})
    validate_task_call("tests.two", [{"nested": [1, "x", None, True, 1.5]}, 2], {})


def test_unknown_task_refused_at_validation(isolated_registry):
    with pytest.raises(UnknownTask):
        validate_task_call("tests.missing", [], {})


@pytest.mark.parametrize("args", [(1, 2), {"a": 1}, "12", None, 3])
def test_args_must_be_a_list(two_args_task, args):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", args, {})
    assert excinfo.value.field == "args"
    assert "JSON list" in excinfo.value.message


@pytest.mark.parametrize("kwargs", [[1, 2], "x", None, 3])
def test_kwargs_must_be_an_object(two_args_task, kwargs):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", [1, 2], kwargs)
    assert excinfo.value.field == "kwargs"
    assert "JSON object" in excinfo.value.message


def test_kwargs_keys_must_be_strings(two_args_task):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", [1, 2], {1: "x"})
    assert excinfo.value.field == "kwargs"
    assert "strings" in excinfo.value.message


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        ([{1, 2}, 2], {}, "args"),
        ([(1, 2), 2], {}, "args"),
        ([float("nan"), 2], {}, "args"),
        ([1], {"b": object()}, "kwargs"),
        ([1], {"b": {1: "int key"}}, "kwargs"),
    ],
)
def test_values_must_be_plain_json(two_args_task, args, kwargs, field):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", args, kwargs)
    assert excinfo.value.field == field
    assert "plain JSON" in excinfo.value.message


def test_missing_required_argument_named(two_args_task):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", [1], {})
    assert "'b'" in excinfo.value.message
    assert "missing" in excinfo.value.message


def test_unexpected_keyword_named(two_args_task):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", [1, 2], {"bogus": 1})
    assert excinfo.value.field == "kwargs"
    assert "'bogus'" in excinfo.value.message


def test_too_many_positional(two_args_task):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", [1, 2, 3, 4], {})
    assert excinfo.value.field == "args"
    assert "positional" in excinfo.value.message


def test_argument_given_twice(two_args_task):
    with pytest.raises(TaskArgumentError, match="'a'"):
        validate_task_call("tests.two", [1, 2], {"a": 1})


def test_error_str_names_field(two_args_task):
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.two", [1, 2], {"bogus": 1})
    assert str(excinfo.value).startswith("kwargs: ")


def test_task_validate_hook_called_and_can_refuse(isolated_registry):
    seen: list[tuple[list, dict]] = []

    def check(args, kwargs):
        seen.append((args, kwargs))
        if kwargs.get("n", 0) < 0:
            raise TaskArgumentError("kwargs", "n must be >= 0")

    @task("tests.hooked", validate=check)
    def hooked(n=0):
        return n

    validate_task_call("tests.hooked", [], {"n": 1})
    assert seen == [([], {"n": 1})]
    with pytest.raises(TaskArgumentError, match="n must be >= 0"):
        validate_task_call("tests.hooked", [], {"n": -1})


def test_hook_sees_only_well_formed_arguments(isolated_registry):
    called = []

    @task("tests.guarded", validate=lambda args, kwargs: called.append(1))
    def guarded(x):
        return x

    with pytest.raises(TaskArgumentError):
        validate_task_call("tests.guarded", "not a list", {})
    assert called == []


def test_takes_context_binding(isolated_registry):
    @task("tests.ctx", takes_context=True)
    def with_context(x, *, context):
        return x

    validate_task_call("tests.ctx", [1], {})  # context is supplied by the executor
    validate_task_call("tests.ctx", [], {"x": 1})
    with pytest.raises(TaskArgumentError, match="'x'"):
        validate_task_call("tests.ctx", [], {})
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.ctx", [1], {"context": "forged"})
    assert excinfo.value.field == "kwargs"
    assert "scheduler" in excinfo.value.message
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("tests.ctx", [1, 2], {})
    assert excinfo.value.field == "args"


def test_takes_context_positional_or_keyword(isolated_registry):
    @task("tests.ctx2", takes_context=True)
    def with_context(x, context):
        return x

    validate_task_call("tests.ctx2", [1], {})
    with pytest.raises(TaskArgumentError, match="positional"):
        validate_task_call("tests.ctx2", [1, 2], {})


# --- autodiscovery -------------------------------------------------------------------------------


def test_autodiscover_finds_builtins():
    registry.autodiscover()
    assert BUILTINS <= set(task_names())
    for name in BUILTINS:
        assert get_task(name).description


def test_autodiscover_is_idempotent():
    before = {name: get_task(name) for name in task_names()}
    registry.autodiscover()
    registry.autodiscover()
    after = {name: get_task(name) for name in task_names()}
    assert before == after


def test_builtin_context_flags():
    assert get_task("noop").takes_context is False
    for name in BUILTINS - {"noop"}:
        assert get_task(name).takes_context is True
        assert get_task(name).validate is not None


# --- TaskContext ---------------------------------------------------------------------------------


def test_context_output_lines():
    context = make_context()
    context.log("first")
    context.log("second")
    assert context.output == "first\nsecond\n"
    assert not context.truncated


def test_context_output_bounded_with_single_marker():
    context = make_context(output_limit=20)
    for index in range(10):
        context.log(f"line {index}")
    output = context.output
    assert output.endswith(TRUNCATION_MARKER)
    assert output.count(TRUNCATION_MARKER) == 1
    kept = output[: -len(TRUNCATION_MARKER)]
    assert len(kept) == 20
    assert kept == "line 0\nline 1\nline 2\nline 3\nline 4\n"[:20]
    assert context.truncated
    context.log("more")
    assert context.output == output


def test_context_output_exactly_at_limit_not_truncated():
    context = make_context(output_limit=6)
    context.log("12345")  # 5 characters plus the newline
    assert context.output == "12345\n"
    context.log("x")
    assert context.output == "12345\n" + TRUNCATION_MARKER


def test_context_default_limit():
    context = make_context()
    assert context.output_limit == 64 * 1024
    context.log("x" * (100 * 1024))
    assert len(context.output) == 64 * 1024 + len(TRUNCATION_MARKER)


def test_context_concurrent_logging_stays_bounded():
    context = make_context(output_limit=1000)

    def spam() -> None:
        for _ in range(200):
            context.log("abcdefghij")

    threads = [threading.Thread(target=spam) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert context.output == "abcdefghij\n" * 90 + "abcdefghij" + TRUNCATION_MARKER


def test_context_cancelled_flag():
    event = threading.Event()
    context = make_context(cancel_event=event)
    assert not context.cancelled
    event.set()
    assert context.cancelled


def test_context_negative_limit_refused():
    with pytest.raises(ValueError):
        make_context(output_limit=-1)
