"""The scheduler's errors, all under :class:`~broker_adapter.errors.ChronoqError`.

Bad input also derives from :class:`ValueError` (or :class:`TypeError` for a value
of the wrong kind), lookups from :class:`LookupError`, so callers that already
catch the stdlib errors keep working. Each message says what was wrong and what
to do about it.

::

    ChronoqError
    └── SchedulerError                          anything the scheduler layer refuses
        ├── JobNotFound (LookupError)           no job registered under a name
        ├── DuplicateJob (ValueError)           a second job under a taken name
        ├── InvalidJobSpec (ValueError)         bad @job options (executor, max_attempts, ...)
        ├── InvalidSchedule (ValueError)        bad timing: naive datetime, past ``at``, combos
        │   └── InvalidCron                     bad cron expression or time zone
        ├── ScheduleNotFound (LookupError)      no schedule (app.schedules) under a name
        ├── DuplicateSchedule (ValueError)      a second schedule under a taken name
        ├── InvalidSettings (ValueError)        a bad Settings field or CHRONOQ_* variable
        └── UnserializableArgument (TypeError)  a job argument JSON cannot carry

Decoding a job call from bytes raises :class:`broker_adapter.errors.DecodeError`,
shared with the broker layer.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from broker_adapter.errors import ChronoqError


class SchedulerError(ChronoqError):
    """Root of the errors raised by the ``scheduler`` package."""


class JobNotFound(SchedulerError, LookupError):
    """No job is registered under ``name``.

    :param name: the name that was looked up.
    :param known: the registered names, used to suggest a close match.
    """

    def __init__(self, name: str, known: Iterable[str] = ()) -> None:
        self.name = name
        known_list = sorted(known)
        hint = ""
        close = difflib.get_close_matches(name, known_list, n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
        super().__init__(
            f"no job named {name!r} is registered{hint}; register it with @app.job, and make "
            "sure the worker imports the module that defines it"
        )


class DuplicateJob(SchedulerError, ValueError):
    """A job name that is already taken.

    :param name: the job name.
    :param existing: a description of the job that holds it, e.g. ``module.func``.
    """

    def __init__(self, name: str, existing: str) -> None:
        self.name = name
        self.existing = existing
        super().__init__(
            f"a job named {name!r} is already registered (by {existing}); give one of them "
            "another name with @app.job(name=...)"
        )


class InvalidJobSpec(SchedulerError, ValueError):
    """A job option that cannot work (unknown executor, ``max_attempts`` < 1, ...).

    :param field: the option's name.
    :param value: the value given.
    :param reason: what is wrong and what to give instead.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"invalid {field}={value!r}: {reason}")


class InvalidSchedule(SchedulerError, ValueError):
    """Timing arguments that cannot be honoured; nothing was sent."""


class InvalidCron(InvalidSchedule):
    """A cron expression that does not parse, never fires, or names an unknown time zone.

    :param expr: the cron expression.
    :param tz: the time zone name.
    :param reason: what is wrong and what to write instead.
    """

    def __init__(self, expr: object, tz: object, reason: str) -> None:
        self.expr = expr
        self.tz = tz
        super().__init__(f"invalid cron {expr!r} (tz={tz!r}): {reason}")


class ScheduleNotFound(SchedulerError, LookupError):
    """No schedule (of ``app.schedules``, or cron/interval job) has ``name``.

    :param name: the name that was looked up.
    :param known: the names there are, used to suggest a close match.
    """

    def __init__(self, name: str, known: Iterable[str] = ()) -> None:
        self.name = name
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(
            f"no schedule named {name!r}{hint}; app.schedules.list() (or `chronoq schedules "
            "list`) shows them, and app.schedules.add() creates one"
        )


class DuplicateSchedule(SchedulerError, ValueError):
    """A schedule name that is already taken (by a stored schedule or a cron job).

    :param name: the schedule name.
    :param existing: what holds it, e.g. ``"a stored schedule"``.
    """

    def __init__(self, name: str, existing: str) -> None:
        self.name = name
        self.existing = existing
        super().__init__(
            f"a schedule named {name!r} already exists ({existing}); pick another name, or "
            "change that one with app.schedules.update()"
        )


class InvalidSettings(SchedulerError, ValueError):
    """A settings field (or the ``CHRONOQ_*`` variable behind it) with a bad value.

    :param field: the :class:`~scheduler.settings.Settings` field.
    :param env: the environment variable that sets it.
    :param value: the value given.
    :param reason: what is wrong and what to give instead.
    """

    def __init__(self, field: str, env: str, value: object, reason: str) -> None:
        self.field = field
        self.env = env
        self.value = value
        super().__init__(f"invalid setting {field} ({env}) = {value!r}: {reason}")


class UnserializableArgument(SchedulerError, TypeError):
    """A job argument that JSON cannot carry faithfully; nothing was sent.

    :param path: where the value sits, e.g. ``args[0]['when']``.
    :param value: the offending value.
    :param hint: what to pass instead.
    """

    def __init__(self, path: str, value: object, hint: str) -> None:
        self.path = path
        self.value = value
        super().__init__(
            f"job argument {path} is a {type(value).__name__} ({value!r:.80}), which JSON "
            f"cannot carry; {hint}"
        )
