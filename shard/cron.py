"""Cron arithmetic for recurring schedules (5-field expressions, IANA time zones)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from shardq.common.errors import InvalidArgument


def check(expr: str, time_zone: str) -> None:
    """Raise InvalidArgument naming the field when the expression or the zone is not valid."""
    if not isinstance(expr, str) or len(expr.split()) != 5 or not croniter.is_valid(expr):
        raise InvalidArgument(f"{expr!r} is not a 5-field cron expression", field="cron")
    zone(time_zone)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"{name!r} is not an IANA time zone", field="time_zone") from exc


def next_tick_ms(expr: str, time_zone: str, after_ms: int) -> int:
    """The first tick strictly after ``after_ms`` (unix ms), in the schedule's time zone."""
    start = datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(zone(time_zone))
    nxt: datetime = croniter(expr, start).get_next(datetime)
    return int(nxt.timestamp() * 1000)


def tick_request_id(schedule_id: str, tick_ms: int) -> str:
    """The request_id of the job a schedule's tick enqueues: firing a tick twice (a retried
    loop, a moved schedule) dedupes to one job. move_schedules_out.lua spells it too."""
    return f"cron:{schedule_id}:{tick_ms}"
