"""Errors of the compression stage; each names what it could not handle and what to do instead."""

from fedzoo.errors import InvalidInputError


class UnsupportedOperationError(InvalidInputError):
    """The model uses an operation that pruning or quantization has no rule for."""


class CalibrationDataError(InvalidInputError):
    """Calibration images for static quantization are missing or malformed."""
