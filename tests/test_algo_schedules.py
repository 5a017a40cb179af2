import math

import pytest

from hpc_rl.algo.schedules import Schedule, constant


def test_schedules_as_functions_of_version():
    lin = Schedule(1e-3, 0.0, versions=100)
    assert [lin(0), lin(50), lin(100), lin(1000)] == pytest.approx([1e-3, 5e-4, 0.0, 0.0])
    cos = Schedule(1.0, 0.0, versions=10, kind="cosine")
    assert [cos(0), cos(5), cos(10)] == pytest.approx([1.0, 0.5, 0.0])
    exp = Schedule(0.99, 0.999, versions=2, kind="exponential")
    assert exp(1) == pytest.approx(math.sqrt(0.99 * 0.999))
    assert constant(0.3)(12345) == 0.3


def test_bad_schedules():
    with pytest.raises(ValueError, match="kind"):
        Schedule(1.0, kind="step")
    with pytest.raises(ValueError, match="versions"):
        Schedule(1.0, 0.0, versions=0)
    with pytest.raises(ValueError, match="exponential"):
        Schedule(0.0, 1.0, kind="exponential")
    with pytest.raises(ValueError, match="set kind"):  # an override of a constant default's end without its kind
        Schedule(1.0, 0.0, versions=150, kind="constant")
    assert Schedule(1.0, 1.0, kind="constant")(7) == 1.0
    with pytest.raises(ValueError, match="version"):
        constant(1.0)(-1)
