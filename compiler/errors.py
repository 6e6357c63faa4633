"""Typed errors of planning and building images."""

from tfc.errors import TfcError


class PlanError(TfcError):
    """A plan that cannot be made: a world that cuts a 128-block, heads that do not divide, …"""


class BuildError(TfcError):
    """An image build that failed: the pack changed underneath, a read came back short, …"""
