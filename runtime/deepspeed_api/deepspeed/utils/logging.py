"""``deepspeed.utils.logging``: DeepSpeed's "DeepSpeed" logger and its rank-filtered helpers.

Lightning's DeepSpeed strategy sets this logger's level (``deepspeed.utils.logging.logger``) and
DeepSpeed's examples print through `log_dist`. The logger is built as DeepSpeed builds it (level
WARNING, one stdout handler with DeepSpeed's format, not propagated), so what a script sees
printed, and at which level, is what it sees with DeepSpeed.
"""

from __future__ import annotations

import functools
import logging
import sys

from runtime.errors import InvalidValueError

__all__ = [
    "get_current_level",
    "get_dist_msg",
    "log_dist",
    "log_dist_once",
    "log_levels",
    "logger",
    "print_dist",
    "set_log_level_from_string",
    "should_log_le",
    "warning_once",
]

log_levels = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def _create_logger(name: str, level: int) -> logging.Logger:
    made = logging.getLogger(name)
    made.setLevel(level)
    made.propagate = False
    # One handler however often this module is imported (it is also reachable under the
    # compatibility package's test-time name), as DeepSpeed's is created once per process.
    if not any(getattr(h, "_deepspeed_handler", False) for h in made.handlers):
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setLevel(level)
        handler.setFormatter(
            logging.Formatter(
                "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"
            )
        )
        handler._deepspeed_handler = True
        made.addHandler(handler)
    return made


logger = _create_logger("DeepSpeed", logging.WARNING)


@functools.lru_cache(None)
def warning_once(*args, **kwargs) -> None:
    """``logger.warning`` once per distinct message (DeepSpeed's ``logger.warning_once``)."""
    logger.warning(*args, **kwargs)


logger.warning_once = warning_once


def get_dist_msg(message, ranks=None):
    """``"[Rank R] message"`` when this rank should log it, else None: always without a process
    group; with one, when ``ranks`` names this rank or is ``[-1]`` (every rank)."""
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    should_log = not initialized
    ranks = ranks or []
    my_rank = dist.get_rank() if initialized else -1
    if ranks and not should_log:
        should_log = ranks[0] == -1 or my_rank in set(ranks)
    return f"[Rank {my_rank}] {message}" if should_log else None


def log_dist(message, ranks=None, level=logging.INFO) -> None:
    """Log ``message`` at ``level`` on the ranks `get_dist_msg` picks."""
    final = get_dist_msg(message, ranks)
    if final is not None:
        logger.log(level, final)


@functools.lru_cache(None)
def _log_dist_once_cached(message, ranks_key, level) -> None:
    log_dist(message, list(ranks_key) if ranks_key is not None else None, level)


def log_dist_once(message, ranks=None, level=logging.INFO) -> None:
    """`log_dist`, once per (message, ranks, level)."""
    _log_dist_once_cached(message, tuple(ranks) if ranks is not None else None, level)


def print_dist(message, ranks=None) -> None:
    """`log_dist`'s choice of ranks, printed whatever the logger's level."""
    final = get_dist_msg(message, ranks)
    if final is not None:
        print(final)


def get_log_level_from_string(log_level_str: str) -> int:
    level = log_levels.get(str(log_level_str).lower())
    if level is None:
        raise InvalidValueError(
            f"{log_level_str!r} is not one of the valid logging levels: {', '.join(log_levels)}"
        )
    return level


def set_log_level_from_string(log_level_str: str, custom_logger=None) -> None:
    """Set the level of ``custom_logger`` (default: the DeepSpeed logger) and its handlers."""
    level = get_log_level_from_string(log_level_str)
    target = logger if custom_logger is None else custom_logger
    target.setLevel(level)
    for handler in target.handlers:
        handler.setLevel(level)


def get_current_level() -> int:
    return logger.getEffectiveLevel()


def should_log_le(max_log_level_str: str) -> bool:
    """Whether the logger's level is at or below ``max_log_level_str`` ("info", ...)."""
    if not isinstance(max_log_level_str, str):
        raise InvalidValueError(f"{max_log_level_str!r} is not a string")
    return get_current_level() <= get_log_level_from_string(max_log_level_str)
