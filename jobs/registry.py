"""The task registry: which Python callables a job may name, and how a call to one is checked.

A job names a registered task plus JSON ``args`` (a list) and ``kwargs`` (an object). Tasks are
registered with the :func:`task` decorator in an app's ``tasks`` module; :func:`autodiscover`
(called from ``JobsConfig.ready``) imports every installed app's ``tasks`` module.

:func:`validate_task_call` is what job creation runs: it refuses an unknown task, arguments that
are not plain JSON, arguments the task's own ``validate`` hook rejects, and a call that could not
bind to the function's signature, so a bad job is refused when it is defined, not when it runs.

The registry is a module-level dict guarded by a lock; registering is thread-safe. (A little over
the usual size: the decorator, the task handle and the call checks belong together.)
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

ERR_UNKNOWN_TASK = "unknown task {name!r}; registered tasks: {known}"
# How many registered names an UnknownTask message lists.
UNKNOWN_TASK_LIST_LIMIT = 10
TRUNCATION_MARKER = "...[output truncated]"
DEFAULT_OUTPUT_LIMIT = 64 * 1024

Validator = Callable[[list, dict], None]


@dataclass(frozen=True)
class Parameter:
    """One argument a task takes, as the job form, the API and ``jobs tasks`` show it."""

    name: str
    type: str  # a JSON type: string, number, integer, boolean, array, object; "any" if unknown
    required: bool
    default: Any = None  # when not required (a JSON value)
    keyword_only: bool = False  # must be given in kwargs

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "required": self.required}
        if not self.required:
            out["default"] = self.default
        if self.keyword_only:
            out["keyword_only"] = True
        return out


@dataclass(frozen=True)
class TaskSpec:
    name: str
    func: Callable[..., Any]
    description: str  # the docstring's first paragraph (its summary), on one line
    takes_context: bool  # if True the executor passes context=TaskContext(...) as a keyword
    validate: Validator | None  # raises TaskArgumentError for bad args at job-creation time
    # An example call: {"args": [...], "kwargs": {...}} (the job form offers it).
    example: dict[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> list[Parameter]:
        """The function's arguments (its signature; ``context`` is the executor's)."""
        return task_parameters(self.func)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": [p.as_dict() for p in self.parameters],
            "example": self.example or {"args": [], "kwargs": {}},
        }


# What a Python annotation (a string, under postponed evaluation) says about the JSON type.
_JSON_TYPES = (
    ("bool", "boolean"),
    ("int", "integer"),
    ("float", "number"),
    ("str", "string"),
    ("list", "array"),
    ("dict", "object"),
)


def _json_type(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "any"
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    head = text.split("|")[0].split("[")[0].strip()
    for python, json_type in _JSON_TYPES:
        if head == python:
            return json_type
    return "any"


def _jsonable_default(value: Any) -> Any:
    return value if _is_plain_json(value) else repr(value)


def task_parameters(func: Callable[..., Any]) -> list[Parameter]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    out: list[Parameter] = []
    for param in signature.parameters.values():
        if param.name == "context" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        required = param.default is inspect.Parameter.empty
        out.append(
            Parameter(
                name=param.name,
                type=_json_type(param.annotation),
                required=required,
                default=None if required else _jsonable_default(param.default),
                keyword_only=param.kind is param.KEYWORD_ONLY,
            )
        )
    return out


class TaskError(Exception):
    """Base class of every error the registry and the built-in tasks raise."""


class UnknownTask(TaskError):
    def __init__(self, name: str, known: list[str] | None = None) -> None:
        self.name = name
        names = task_names() if known is None else sorted(known)
        if not names:
            listed = "(none)"
        else:
            listed = ", ".join(repr(n) for n in names[:UNKNOWN_TASK_LIST_LIMIT])
            if len(names) > UNKNOWN_TASK_LIST_LIMIT:
                listed += f", ... ({len(names)} in all)"
        super().__init__(ERR_UNKNOWN_TASK.format(name=name, known=listed))


class TaskArgumentError(TaskError):
    """Bad arguments for a task. ``field`` is ``"args"`` or ``"kwargs"``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class DuplicateTask(TaskError):
    """A different function is already registered under this name."""


_registry: dict[str, TaskSpec] = {}
_lock = threading.Lock()
_discover_lock = threading.RLock()


def _description(func: Callable[..., Any]) -> str:
    """The docstring's summary: its first paragraph (up to the first blank line), on one line. A
    summary sentence often wraps onto a second line; its first line alone is cut mid-sentence."""
    doc = inspect.getdoc(func) or ""
    summary: list[str] = []
    for line in doc.splitlines():
        if line.strip():
            summary.append(line.strip())
        elif summary:
            break
    return " ".join(summary)


def _accepts_context_keyword(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    param = params.get("context")
    if param is not None:
        return param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
    return any(p.kind is p.VAR_KEYWORD for p in params.values())


def _same_definition(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """True for the same function object, or the same function re-created by a module reload."""
    if a is b:
        return True
    return (
        getattr(a, "__module__", None) is not None
        and getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
        and "<locals>" not in getattr(a, "__qualname__", "<locals>")
    )


def _register(
    func: Callable[..., Any],
    name: str | None,
    takes_context: bool,
    validate: Validator | None,
    example: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    if not callable(func):
        raise TypeError(f"@task needs a callable, got {func!r}")
    if validate is not None and not callable(validate):
        raise TypeError(f"validate must be callable or None, got {validate!r}")
    task_name = name if name is not None else f"{func.__module__}.{func.__qualname__}"
    if not isinstance(task_name, str) or not task_name.strip():
        raise TypeError(f"task name must be a non-empty string, got {task_name!r}")
    if takes_context and not _accepts_context_keyword(func):
        raise TypeError(
            f"task {task_name!r} is registered with takes_context=True but "
            f"{func.__qualname__} has no 'context' keyword parameter"
        )
    spec = TaskSpec(
        name=task_name,
        func=func,
        description=_description(func),
        takes_context=bool(takes_context),
        validate=validate,
        example=dict(example or {}),
    )
    with _lock:
        existing = _registry.get(task_name)
        if existing is not None:
            if existing.func is func:
                return func  # the same function again: a no-op
            if not _same_definition(existing.func, func):
                raise DuplicateTask(
                    f"task {task_name!r} is already registered to "
                    f"{existing.func.__module__}.{existing.func.__qualname__}"
                )
            # The module was reloaded: the new function object replaces the old one.
        _registry[task_name] = spec
    _bind_enqueue(func, task_name)
    return func


def _bind_enqueue(func: Callable[..., Any], task_name: str) -> None:
    """Give a task function ``.enqueue(*args, **kwargs)`` (a run of it called with exactly these
    arguments, as Celery's ``delay``, into its job) and ``.enqueue_call(args=, kwargs=, job=,
    run_at=, priority=, idempotency_key=)``; both are ``jobs.client.enqueue_task``. A callable
    that takes no attributes goes without."""

    def enqueue(*args: Any, **kwargs: Any) -> Any:
        from jobs.client import enqueue_task

        return enqueue_task(task_name, args=list(args), kwargs=dict(kwargs))

    def enqueue_call(
        args: list[Any] | None = None, kwargs: dict[str, Any] | None = None, **options: Any
    ) -> Any:
        from jobs.client import enqueue_task

        return enqueue_task(task_name, args=args, kwargs=kwargs, **options)

    try:
        func.enqueue = enqueue  # type: ignore[attr-defined]
        func.enqueue_call = enqueue_call  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass


def task(
    name: str | Callable[..., Any] | None = None,
    *,
    takes_context: bool = False,
    validate: Validator | None = None,
    example: dict[str, Any] | None = None,
    schedule: Any = None,
    job: dict[str, Any] | None = None,
) -> Any:
    """Register a function as a task; returns the function, given ``.enqueue`` and
    ``.enqueue_call`` (``jobs.client``). ``example``: a call to offer in the job form,
    ``{"args": [...], "kwargs": {...}}``.

    ``schedule`` (a cron expression, or an interval in seconds or as a timedelta) and ``job``
    (more fields of a job definition) declare a job named after the task
    (``jobs.declarations``), created by ``jobs apply --from-code``.

    ``@task("noop")``, ``@task()`` and bare ``@task`` all work; the default name is
    ``f"{module}.{qualname}"``. Registering a different function under a taken name raises
    :class:`DuplicateTask`; registering the same function again is a no-op.
    """
    if callable(name):  # bare @task
        return _register(name, None, takes_context, validate, example)
    if job is not None and not isinstance(job, dict):
        raise TypeError(f"job must be a dict of job definition fields, got {job!r}")

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        registered = _register(func, name, takes_context, validate, example)
        if schedule is not None or job is not None:
            from jobs import declarations

            task_name = name if name is not None else f"{func.__module__}.{func.__qualname__}"
            fields = dict(job or {})
            if schedule is not None:
                fields.update(declarations.schedule_fields(schedule))
            declarations.declare_job(fields.pop("name", task_name), task=task_name, **fields)
        return registered

    return decorator


def get_task(name: str) -> TaskSpec:
    with _lock:
        spec = _registry.get(name) if isinstance(name, str) else None
        if spec is None:
            raise UnknownTask(name, sorted(_registry))
    return spec


def is_registered(name: str) -> bool:
    with _lock:
        return isinstance(name, str) and name in _registry


def task_names() -> list[str]:
    with _lock:
        return sorted(_registry)


def task_catalog() -> list[dict[str, Any]]:
    """Every registered task with its description, arguments and example, by name."""
    with _lock:
        specs = sorted(_registry.values(), key=lambda spec: spec.name)
    return [spec.as_dict() for spec in specs]


def encode_plain(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, refusing what is not plain JSON's (NaN: ValueError; a lone
    surrogate, which the database would refuse at insert: UnicodeEncodeError)."""
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()


def _is_plain_json(value: Any) -> bool:
    """True when ``value`` survives a JSON round trip unchanged (no tuples, sets, NaN, int keys)."""
    try:
        return json.loads(encode_plain(value)) == value
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError):
        return False


_PLAIN_JSON = "lists, objects with string keys, strings, numbers, booleans and null only"


@functools.lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    """``func``'s signature, read once (an enqueue request binds thousands of calls to one task);
    None when it cannot be inspected."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def bind_arguments(
    func: Callable[..., Any], args: list, kwargs: dict, *, takes_context: bool = False
) -> inspect.BoundArguments | None:
    """Bind ``args``/``kwargs`` to ``func``'s signature (the ``context`` keyword left out).

    Returns the bound arguments (defaults applied), ``None`` when the signature cannot be
    inspected, or raises :class:`TaskArgumentError` naming the parameter that does not fit.
    """
    try:
        signature = _signature(func)
    except TypeError:  # an unhashable callable: not cached
        signature = _signature.__wrapped__(func)
    if signature is None:
        return None
    if takes_context and "context" in kwargs:
        raise TaskArgumentError("kwargs", "'context' is supplied by the scheduler, not by the job")
    try:
        if takes_context:
            bound = signature.bind(*args, **kwargs, context=None)
        else:
            bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        reason = str(exc)
        where = "args" if "too many positional" in reason else "kwargs"
        raise TaskArgumentError(where, f"cannot call {func.__qualname__}: {reason}") from None
    bound.apply_defaults()
    if takes_context:
        bound.arguments.pop("context", None)
    return bound


def validate_task_call(
    name: str, args: Any, kwargs: Any, *, plain_json: tuple[bool, bool] | None = None
) -> None:
    """Refuse, at job-creation time, a call that is bound to fail. Returns None when it is fine.

    Raises :class:`UnknownTask`, or :class:`TaskArgumentError` when ``args`` is not a JSON list,
    ``kwargs`` is not a JSON object with string keys, the task's ``validate`` hook refuses them, or
    the call cannot bind to the function's signature (a missing or unexpected argument).
    """
    spec = get_task(name)
    if not isinstance(args, list):
        raise TaskArgumentError("args", f"must be a JSON list, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TaskArgumentError("kwargs", f"must be a JSON object, got {type(kwargs).__name__}")
    bad_keys = [key for key in kwargs if not isinstance(key, str)]
    if bad_keys:
        raise TaskArgumentError("kwargs", f"keys must be strings, got {bad_keys[0]!r}")
    # ``plain_json``: the caller already knows (it encoded the values once for their size).
    args_plain, kwargs_plain = plain_json or (_is_plain_json(args), _is_plain_json(kwargs))
    if not args_plain:
        raise TaskArgumentError("args", f"must be plain JSON ({_PLAIN_JSON})")
    if not kwargs_plain:
        raise TaskArgumentError("kwargs", f"must be plain JSON ({_PLAIN_JSON})")
    if spec.validate is not None:
        spec.validate(list(args), dict(kwargs))
    try:
        problem = _binding_problem(spec.func, spec.takes_context, len(args), tuple(kwargs))
    except TypeError:  # an unhashable callable: not cached
        problem = _binding_problem.__wrapped__(
            spec.func, spec.takes_context, len(args), tuple(kwargs)
        )
    if problem is not None:
        raise TaskArgumentError(*problem)


@functools.lru_cache(maxsize=4096)
def _binding_problem(
    func: Callable[..., Any], takes_context: bool, count: int, keywords: tuple[str, ...]
) -> tuple[str, str] | None:
    """(field, message) when a call of ``count`` positional arguments and these keywords cannot
    bind to ``func``, else None. Binding depends on the call's shape alone, never on its values:
    the thousands of runs of one enqueue request are bound once."""
    try:
        bind_arguments(func, [None] * count, dict.fromkeys(keywords), takes_context=takes_context)
    except TaskArgumentError as exc:
        return exc.field, exc.message
    return None


def autodiscover() -> None:
    """Import every installed app's ``tasks`` module, and the modules named in
    ``settings.SCHEDULER_TASK_MODULES``, so their tasks register. Safe to call again."""
    from importlib import import_module

    from django.utils.module_loading import autodiscover_modules

    from jobs.conf import app_setting

    with _discover_lock:
        autodiscover_modules("tasks")
        for module in app_setting("SCHEDULER_TASK_MODULES"):
            import_module(module)


@dataclass
class TaskContext:
    """What a running task may use: who it runs for, a bounded output log, the cancel flag, and
    the two ways to keep its own writes safe when a run is declared lost and run again elsewhere
    (docs/jobs.md, "Fencing your own writes"):

    - ``fencing_token``: grows with every run of the job (a later fire, a retry: a run that
      supersedes another always has a larger one); a store that keeps the largest token it has
      accepted refuses the writes of a superseded run (``jobs.fencing.fenced_update``);
    - ``idempotency_key``: the same for every claim of one attempt of one fire
      (``<job id>:<slot>:<attempt>``), for a service that deduplicates by key;
    - ``still_owner()``: whether this run still holds its claim (its node's membership unbroken
      since the claim, its job lock held, not cancelled): a long body checks it between steps.
    """

    execution_id: int | None
    job_name: str
    attempt: int
    scheduled_for: datetime | None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    fencing_token: int | None = None
    idempotency_key: str = ""
    # Set by the executor: whether the claim still holds (None: only the cancel flag is known).
    owner_check: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    _parts: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    _size: int = field(default=0, init=False, repr=False, compare=False)
    _truncated: bool = field(default=False, init=False, repr=False, compare=False)
    _output_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.output_limit < 0:
            raise ValueError("output_limit must be >= 0")

    def log(self, message: str) -> None:
        """Append a line to the output; past ``output_limit`` characters the rest is dropped."""
        line = f"{message}\n"
        with self._output_lock:
            if self._truncated:
                return
            room = self.output_limit - self._size
            if len(line) <= room:
                self._parts.append(line)
                self._size += len(line)
                return
            if room > 0:
                self._parts.append(line[:room])
                self._size += room
            self._truncated = True

    @property
    def output(self) -> str:
        with self._output_lock:
            text = "".join(self._parts)
            return text + TRUNCATION_MARKER if self._truncated else text

    @property
    def truncated(self) -> bool:
        return self._truncated

    @property
    def size(self) -> int:
        """How many characters ``output`` holds (cheap: nothing is joined)."""
        return self._size + (len(TRUNCATION_MARKER) if self._truncated else 0)

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def still_owner(self) -> bool:
        """True while this run still holds its claim; False once it may have been declared lost
        (its node's presence lapsed), its job lock was lost, or it was cancelled. A body that
        sees False should stop and write nothing more."""
        if self.cancel_event.is_set():
            return False
        return True if self.owner_check is None else bool(self.owner_check())
