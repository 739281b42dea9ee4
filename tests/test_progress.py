"""The job-level estimate of `laquant calibrate` (laquant.progress): its logic on a fake clock."""

import pytest

from laquant.progress import JobEstimate, JobProgress, Phase, clock


def _phases():
    return [Phase("bf16 prefill", "prefill", 1000), Phase("bf16 decode", "decode", 100),
            Phase("calibration", "calibrate", 4000), Phase("q prefill", "prefill_q", 1000),
            Phase("q decode", "decode_q", 100)]


PROXIES = {"calibrate": "prefill", "prefill_q": "prefill", "decode_q": "decode"}


def test_no_estimate_without_a_rate_for_every_remaining_phase():
    est = JobEstimate(_phases(), PROXIES)
    assert est.remaining() == (None, False)
    est.probe("prefill", 2.0, 1000)  # 2 ms a token
    assert est.remaining() == (None, False)  # decode steps: nothing measured stands in for them
    est.probe("decode", 1.0, 10)  # 0.1 s a step
    seconds, exact = est.remaining()
    # prefill tokens 1000 + 4000 (calibration, by proxy) + 1000 (quantized, by proxy) at 2 ms,
    # 200 decode steps at 0.1 s
    assert seconds == pytest.approx(6000 * 0.002 + 200 * 0.1) and not exact


def test_decode_steps_weigh_by_their_measured_cost():
    """A decode step costs what it was measured to cost, not a token's worth of prefill."""
    est = JobEstimate([Phase("p", "prefill", 1000), Phase("d", "decode", 100)])
    est.probe("prefill", 1.0, 1000)
    est.probe("decode", 5.0, 10)
    assert est.remaining() == (pytest.approx(1.0 + 50.0), True)


def test_phases_replace_the_probe_and_proxies_once_measured():
    est = JobEstimate(_phases(), PROXIES, min_seconds=1.0)
    est.probe("prefill", 1.0, 1000)
    est.probe("decode", 1.0, 10)
    est.phases[0].done = 1000
    est.phases[1].done = 100
    p = est.phases[2]
    p.done = 100
    est.measure("calibrate", 0.5, 100)  # under min_seconds, but the kind has no rate of its own: taken
    assert est.rate("calibrate") == (pytest.approx(0.005), True)
    p.done = 400
    est.measure("calibrate", 1.5, 300)  # 2 s for 400 tokens: 5 ms a token, 5x the prefill rate
    assert est.rate("calibrate") == (pytest.approx(0.005), True)
    seconds, exact = est.remaining()
    assert seconds == pytest.approx(3600 * 0.005 + 1000 * 0.001 + 100 * 0.1) and not exact
    est.measure("prefill_q", 2.0, 1000)
    est.measure("decode_q", 2.0, 10)
    assert est.remaining()[1]  # every remaining kind measured itself: no "~"


def test_probe_and_phase_measurements():
    """A phase's first moments (under min_seconds: one-off costs) do not replace the probe; a
    measured phase is not replaced by a probe."""
    est = JobEstimate([Phase("p", "prefill", 1000)], min_seconds=1.0)
    est.probe("prefill", 1.0, 1000)
    est.measure("prefill", 0.5, 10)
    assert est.rate("prefill") == (pytest.approx(0.001), True)
    est.measure("prefill", 1.5, 90)
    assert est.rate("prefill") == (pytest.approx(0.02), True)
    est.probe("prefill", 1.0, 1000)
    assert est.rate("prefill") == (pytest.approx(0.02), True)


def test_progress_line_on_a_fake_clock():
    t = [0.0]
    prog = JobProgress(_phases()[:2], enabled=False, now=lambda: t[0])
    assert prog.line() == "job: starting | 0:00 elapsed | ETA ?"
    prog.probe("prefill", 1.0, 100)  # 10 ms a token
    prog.probe("decode", 2.0, 10)  # 0.2 s a step
    with prog.phase("bf16 prefill"):
        t[0] = 3.0
        prog.advance(500)  # 3 s for 500 tokens: 6 ms a token from now on
        assert prog.line() == "job: phase 1/2 bf16 prefill | 0:03 elapsed | ETA 0:23"  # 500 x 6 ms + 100 x 0.2 s
    with prog.phase("bf16 decode"):
        t[0] = 65.0
        prog.advance(50)
        assert prog.line() == "job: phase 2/2 bf16 decode | 1:05 elapsed | ETA 1:02"  # 50 x 1.24 s
    assert prog.line() == "job: after phase 2/2 bf16 decode | 1:05 elapsed | ETA 0:00"
    assert prog.close() == "1:05"
    assert clock(3725) == "1:02:05" and clock(None) == "?"
