"""The runtime's user-facing error tree (runtime.errors)."""

from __future__ import annotations

import pytest

from runtime.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnsupportedError,
    UsageError,
    UserError,
)


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (InvalidValueError, ValueError),
        (InvalidTypeError, TypeError),
        (UsageError, RuntimeError),
        (UnsupportedError, NotImplementedError),
    ],
)
def test_each_kind_is_a_user_error_and_its_builtin(cls, builtin):
    err = cls("the message names the fix")
    assert isinstance(err, UserError)
    assert isinstance(err, builtin)
    with pytest.raises(builtin, match="names the fix"):
        raise err
