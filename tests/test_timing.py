"""The epoch model (tau presets, capacity, beta windows, alpha epochs, hop delays) and sizes."""

import math

import numpy as np
import pytest

from flowride.errors import InputError
from flowride.topology import Link, Node, Topology, ndv2, ring, switch
from flowride.topology.timing import (
    ALPHA_IGNORED_BELOW,
    MAX_ALPHA_PER_EPOCH,
    epoch_timing,
    link_hop_delay,
    resolve_tau,
)
from flowride.units import format_size, parse_size

COMPAT = ndv2(2, teccl_compat=True)
GB_CHUNK = 1e9 / 16
MB_CHUNK = 1e6 / 16


def by_bandwidth(topo, values) -> dict[float, set]:
    out: dict[float, set] = {}
    for lk, v in zip(topo.links, values, strict=True):
        out.setdefault(lk.bandwidth_GBps, set()).add(round(float(v), 9))
    return out


# -------------------------------------------------------------------------- presets on NDv2


def test_slow_preset_1gb():
    tm = epoch_timing(COMPAT, GB_CHUNK, "slow")
    assert tm.tau == pytest.approx(5e-3)
    assert tm.requested_tau == pytest.approx(5e-3)
    assert tm.chunk_bytes == GB_CHUNK
    assert by_bandwidth(COMPAT, tm.cap_per_epoch) == {50.0: {4.0}, 25.0: {2.0}, 12.5: {1.0}}
    assert by_bandwidth(COMPAT, tm.window_cap) == {50.0: {4}, 25.0: {2}, 12.5: {1}}
    assert (tm.beta_epochs == 0).all()
    assert (tm.alpha_epochs == 0).all()  # 0.7 us / 5 ms


def test_fast_preset_1gb():
    tm = epoch_timing(COMPAT, GB_CHUNK, "fast")
    assert tm.tau == pytest.approx(1.25e-3)
    assert by_bandwidth(COMPAT, tm.beta_epochs) == {50.0: {0}, 25.0: {1}, 12.5: {3}}
    assert (tm.window_cap == 1).all()
    assert by_bandwidth(COMPAT, tm.cap_per_epoch) == {50.0: {1.0}, 25.0: {0.5}, 12.5: {0.25}}
    assert (tm.alpha_epochs == 0).all()


def test_alpha_epochs_at_1mb():
    slow = epoch_timing(COMPAT, MB_CHUNK, "slow")
    assert slow.tau == pytest.approx(5e-6)
    # NVLink 0.7 us / 5 us = 0.14 > 0.1 -> one epoch; IB 1.3 / 5 = 0.26 -> one epoch
    assert (slow.alpha_epochs == 1).all()
    fast = epoch_timing(COMPAT, MB_CHUNK, "fast")
    assert fast.tau == pytest.approx(1.25e-6)
    # 0.7 / 1.25 = 0.56 -> 1; IB 1.3 / 1.25 = 1.04 -> 2
    alphas: dict[float, set] = {}
    for lk, a in zip(COMPAT.links, fast.alpha_epochs, strict=True):
        alphas.setdefault(round(lk.alpha_s * 1e6, 6), set()).add(int(a))
    assert alphas == {0.7: {1}, 1.3: {2}}


@pytest.mark.parametrize(
    "tau,expected",
    [
        (1e-5, 0),  # 0.07
        (7e-6, 0),  # 0.1 (up to rounding): at the threshold, still free
        (6.9e-6, 1),  # 0.1014
        (0.7e-6, 1),  # exactly 1
        (0.35e-6, 2),  # exactly 2, no spurious third epoch from rounding
        (0.3e-6, 3),  # 2.33
    ],
)
def test_alpha_epoch_rounding(tau, expected):
    t = ring(3)  # alpha 0.7 us on every link
    tm = epoch_timing(t, 1e3, tau)
    assert tm.tau == pytest.approx(tau)
    assert (tm.alpha_epochs == expected).all()


def test_alpha_threshold_constant():
    assert ALPHA_IGNORED_BELOW == 0.1
    assert MAX_ALPHA_PER_EPOCH == 200.0


def test_tau_raised_for_tiny_chunks():
    # 1KB over 16 ranks: 62.5 B chunks; fast tau 1.25 ns, but 0.7 us / 1.25 ns = 560 > 200
    tm = epoch_timing(COMPAT, 1e3 / 16, "fast")
    assert tm.requested_tau == pytest.approx(1.25e-9)
    assert tm.tau == pytest.approx(0.7e-6 / 200)
    assert tm.tau == pytest.approx(3.5e-9)
    assert (tm.alpha_epochs == 200).sum() == sum(1 for lk in COMPAT.links if lk.alpha_s == pytest.approx(0.7e-6))
    tau, req = resolve_tau(COMPAT, 1e3 / 16, "slow")
    assert req == pytest.approx(5e-9) and tau == pytest.approx(5e-9)  # 140 <= 200: not raised


def test_no_raise_when_all_alphas_zero():
    t = ring(3, alpha_us=0.0)
    tm = epoch_timing(t, 1.0, "fast")
    assert tm.tau == pytest.approx(1.0 / 50e9)
    assert (tm.alpha_epochs == 0).all()


def test_beta_window_and_capacity_from_explicit_tau():
    t = ring(3)  # 50 GB/s: a 1 MB chunk takes 20 us
    for tau, cap, b, win in [(20e-6, 1.0, 0, 1), (10e-6, 0.5, 1, 1), (6e-6, 0.3, 3, 1), (30e-6, 1.5, 0, 1), (50e-6, 2.5, 0, 2)]:
        tm = epoch_timing(t, 1e6, tau)
        assert tm.cap_per_epoch == pytest.approx(np.full(6, cap))
        assert (tm.beta_epochs == b).all(), tau
        assert (tm.window_cap == win).all(), tau


def test_preset_strings_and_numbers():
    t = ring(3)
    assert epoch_timing(t, 1e6, " FAST ").tau == pytest.approx(2e-5)
    assert epoch_timing(t, 1e6, "Slow").tau == pytest.approx(2e-5)
    assert epoch_timing(t, 1e6, "5e-6").tau == pytest.approx(5e-6)
    assert epoch_timing(t, 1e6, 5e-6).tau == pytest.approx(5e-6)


@pytest.mark.parametrize("epoch", ["medium", "", "fastest", "-1", "0", "nan", "inf", 0, -1e-6, 0.0, math.nan, math.inf])
def test_bad_epoch_raises(epoch):
    with pytest.raises(InputError) as ei:
        epoch_timing(ring(3), 1e6, epoch)
    assert ei.value.field == "epoch"


@pytest.mark.parametrize("chunk", [0, -1.0])
def test_zero_chunk_raises(chunk):
    with pytest.raises(InputError) as ei:
        epoch_timing(ring(3), chunk, "fast")
    assert ei.value.field == "size"


# ------------------------------------------------------------------------------- hop delays


@pytest.mark.parametrize("a,b", [(0, 0), (1, 0), (0, 3), (2, 1)])
def test_link_hop_delay(a, b):
    assert link_hop_delay(False, False, a, b) == 1 + a + b  # GPU -> GPU
    assert link_hop_delay(True, False, a, b) == a + b  # switch -> GPU: the transfer is under way, own beta
    # cut-through (the default): into a switch only alpha, the transmission epoch from a GPU, and
    # the beta by which this link is slower than the switch's fastest way out
    assert link_hop_delay(False, True, a, b) == 1 + a + b  # the switch's fastest way out has b = 0
    assert link_hop_delay(False, True, a, b, b_out_min=b) == 1 + a
    assert link_hop_delay(True, True, a, b, b_out_min=b) == a  # between forwarding switches: no epoch
    assert link_hop_delay(True, True, a, b, b_out_min=b, copy_end=True) == 1 + a  # a copying end: one epoch
    # store-and-forward: every hop into a switch pays its own beta
    for src in (False, True):
        assert link_hop_delay(src, True, a, b, switching="store-and-forward", b_out_min=b) == 1 + a + b
    assert link_hop_delay(True, False, a, b, teccl_compat=True) == a  # published model: alpha only
    assert link_hop_delay(False, True, a, b, teccl_compat=True, b_out_min=b) == 1 + a + b


@pytest.mark.parametrize("b_in,b_out", [(0, 0), (3, 3), (5, 2), (2, 5), (8, 0)])
def test_cut_through_path_pays_its_slowest_hop_once(b_in, b_out):
    """GPU -> switch -> GPU costs 1 + alpha's + the larger beta when the way out is the switch's fastest."""
    t = Topology("pair", (Node(0), Node(1), Node(2, "switch", copy=False)),
                 (Link(0, 2, 50.0 / (b_in + 1), 0.0), Link(2, 1, 50.0 / (b_out + 1), 0.0),
                  Link(1, 2, 50.0 / (b_out + 1), 0.0), Link(2, 0, 50.0 / (b_out + 1), 0.0)))
    tm = epoch_timing(t, 1e6, 2e-5)  # 1 MB in 20 us = one chunk per epoch at 50 GB/s
    li = t.link_index
    assert tm.beta_epochs[li[(0, 2)]] == b_in and tm.beta_epochs[li[(2, 1)]] == b_out
    assert tm.arrival(li[(2, 1)], tm.arrival(li[(0, 2)], 0)) == 1 + max(b_in, b_out)
    sf = epoch_timing(t.with_switching("store-and-forward"), 1e6, 2e-5)
    assert sf.arrival(li[(2, 1)], sf.arrival(li[(0, 2)], 0)) == 1 + b_in + b_out


def test_hop_delay_on_a_switch_topology():
    # 50 GB/s, 1 MB chunk (20 us), tau 10 us -> b = 1; alpha 5 us -> a = 1
    t = switch(3, alpha_us=5.0)
    tm = epoch_timing(t, 1e6, 1e-5)
    assert (tm.beta_epochs == 1).all() and (tm.alpha_epochs == 1).all()
    sf = epoch_timing(t.with_switching("store-and-forward"), 1e6, 1e-5)
    for li, lk in enumerate(t.links):
        if lk.dst == 3:  # GPU -> switch: 1 + a, the beta is paid once, on the way out
            assert tm.hop_delay[li] == 2 and sf.hop_delay[li] == 3
            assert tm.dst_is_switch[li] and not tm.src_is_switch[li]
            assert tm.arrival(li, 4) == 6
        else:  # switch -> GPU: a + b
            assert tm.hop_delay[li] == 2
            assert tm.src_is_switch[li] and not tm.dst_is_switch[li]
            assert tm.arrival(li, 4) == 6


def test_hop_delay_switch_to_switch():
    nodes = (Node(0), Node(1), Node(2, "switch"), Node(3, "switch"))
    links = (
        Link(0, 2, 50.0, 0.7e-6),
        Link(2, 3, 50.0, 0.7e-6),
        Link(3, 1, 50.0, 0.7e-6),
        Link(1, 0, 50.0, 0.7e-6),
    )
    t = Topology("chain", nodes, links)
    tm = epoch_timing(t, 1e6, 1e-5)  # b = 1, a = 0 (0.07)
    # cut-through; these switches copy (Node's default), so the hop between them keeps one epoch
    assert list(tm.hop_delay) == [1, 1, 1, 2]
    fwd = Topology("chain", (nodes[0], nodes[1], Node(2, "switch", copy=False), Node(3, "switch", copy=False)), links)
    assert list(epoch_timing(fwd, 1e6, 1e-5).hop_delay) == [1, 0, 1, 2]  # 0 -> 2 -> 3 -> 1: 1 + b = 2 epochs
    sf = epoch_timing(t.with_switching("store-and-forward"), 1e6, 1e-5)
    assert list(sf.hop_delay) == [2, 2, 1, 2]


def test_compat_hop_delays_from_gpu0_switch():
    tm = epoch_timing(COMPAT, MB_CHUNK, "fast")
    li = COMPAT.link_index
    # node 0 is a switch: its out-links into GPUs cost only alpha
    assert tm.hop_delay[li[(0, 9)]] == 2  # IB alpha 1.3 us / 1.25 us -> 2
    assert tm.hop_delay[li[(0, 1)]] == 1
    assert tm.hop_delay[li[(1, 0)]] == 2  # 1 + a into the switch
    assert tm.hop_delay[li[(8, 1)]] == 1 + 2 + 3  # GPU -> GPU over IB, b = 3
    assert tm.hop_delay[li[(2, 3)]] == 1 + 1 + 0


# ---------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "text,expected",
    [
        ("1KB", 1000),
        ("1KiB", 1024),
        ("16MB", 16_000_000),
        ("16 MB", 16_000_000),
        ("16mb", 16_000_000),
        ("1GB", 10**9),
        ("1GiB", 2**30),
        ("4MiB", 4 * 2**20),
        ("1TB", 10**12),
        ("2B", 2),
        ("4096", 4096),
        ("1.5KB", 1500),
        ("1e3", 1000),
        (4096, 4096),
        (1e6, 1_000_000),
    ],
)
def test_parse_size(text, expected):
    got = parse_size(text)
    assert got == expected
    assert isinstance(got, int)


@pytest.mark.parametrize("text", ["0", "0KB", "-1MB", "abc", "5XB", "", "MB", "1 2", True, 0, -5, "nan"])
def test_parse_size_rejects(text):
    with pytest.raises(InputError) as ei:
        parse_size(text, field="--size")
    assert ei.value.field == "--size"


@pytest.mark.parametrize("text", ["0.3", 0.4, "0.4B", "inf", 1e400])
def test_parse_size_rejects_under_a_byte_and_infinite(text):
    with pytest.raises(InputError) as ei:
        parse_size(text)
    assert ei.value.field == "size"


def test_parse_size_rounds_to_whole_bytes():
    assert parse_size("0.6") == 1
    assert parse_size("1.5KiB") == 1536


@pytest.mark.parametrize("n,text", [(1000, "1KB"), (16_000_000, "16MB"), (10**9, "1GB"), (1500, "1.5KB"), (512, "512B")])
def test_format_size(n, text):
    assert format_size(n) == text
