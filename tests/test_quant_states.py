"""Tests of the quantization state machine, policies and configs (DESIGN.md §3)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ppqlike.core.errors import QuantizationPolicyError, QuantizationStateError
from ppqlike.core.numerics import fake_quantize, quantize
from ppqlike.core.quant_operation import OperationQuantizationConfig
from ppqlike.core.quant import (
    STATE_TRANSITIONS, QuantizationPolicy, QuantizationProperty,
    QuantizationStates, RoundingPolicy, TensorQuantizationConfig, can_transition, is_applied, is_baked,
    is_dequantizable, is_governed,
)

S = QuantizationStates
Q = QuantizationProperty
PT_SYM = QuantizationPolicy(Q.PER_TENSOR | Q.LINEAR | Q.SYMMETRICAL)
PT_ASYM = QuantizationPolicy(Q.PER_TENSOR | Q.LINEAR | Q.ASYMMETRICAL)
PC_SYM = QuantizationPolicy(Q.PER_CHANNEL | Q.LINEAR | Q.SYMMETRICAL)


def tqc(name="t", scale=0.5, offset=0, policy=PT_SYM, **kw) -> TensorQuantizationConfig:
    return TensorQuantizationConfig(policy, scale=scale, offset=offset, name=name, **kw)


def in_state(state: QuantizationStates, dequantized_from=None) -> TensorQuantizationConfig:
    """A config named 'victim' in ``state``, with an own scale and, where needed, masters."""
    cfg = tqc("victim", scale=0.25)
    master, other = tqc("m", scale=0.125, state=S.ACTIVATED), tqc("w", scale=0.5, state=S.ACTIVATED)
    if state is S.DEQUANTIZED:
        cfg = in_state(dequantized_from)
        cfg.set_dequantized()
    elif state in (S.OVERLAPPED, S.SLAVE):
        cfg.dominated_by(master, state)
    elif state in (S.PASSIVE_INIT, S.PASSIVE):
        cfg.dominated_by([master, other], state)
    elif state is S.PASSIVE_BAKED:
        cfg.dominated_by([master, other], S.PASSIVE)
        cfg.state = S.PASSIVE_BAKED
    elif state is not S.INITIAL:
        cfg.state = state
    assert cfg.state is state
    return cfg


def move(cfg: TensorQuantizationConfig, new: QuantizationStates) -> None:
    """Perform a transition the way a pass would."""
    if new in (S.OVERLAPPED, S.SLAVE) and len(cfg.masters) != 1:
        cfg.dominated_by(tqc("new-master", state=S.ACTIVATED), new)
    else:
        cfg.state = new


NON_DEQ = [s for s in S if s is not S.DEQUANTIZED]
LEGAL = [(a, b) for a in NON_DEQ for b in sorted(STATE_TRANSITIONS[a], key=lambda s: s.name)]
ILLEGAL = [(a, b) for a in NON_DEQ for b in S if b not in STATE_TRANSITIONS[a]]


# ------------------------------------------------------------- the table
def test_twelve_states_and_a_complete_table():
    assert {s.name for s in S} == {"INITIAL", "ACTIVATED", "BAKED", "OVERLAPPED", "SLAVE", "DEACTIVATED",
                                   "DEQUANTIZED", "SOI", "PASSIVE", "PASSIVE_INIT", "PASSIVE_BAKED", "FP32"}
    assert set(STATE_TRANSITIONS) == set(S)
    assert all(isinstance(v, frozenset) for v in STATE_TRANSITIONS.values())
    assert STATE_TRANSITIONS[S.SOI] == frozenset()
    assert can_transition(S.PASSIVE_INIT, S.PASSIVE) and not can_transition(S.BAKED, S.ACTIVATED)


@pytest.mark.parametrize("current,new", LEGAL, ids=lambda s: s.name)
def test_every_legal_transition_succeeds(current, new):
    cfg = in_state(current)
    move(cfg, new)
    assert cfg.state is new


@pytest.mark.parametrize("previous", sorted(STATE_TRANSITIONS[S.DEQUANTIZED], key=lambda s: s.name),
                         ids=lambda s: s.name)
def test_dequantized_goes_back_only_where_it_came_from(previous):
    cfg = in_state(S.DEQUANTIZED, previous)
    for other in S:
        if other is not previous:
            with pytest.raises(QuantizationStateError, match=f"'victim'.*DEQUANTIZED -> {other.name}"):
                cfg.state = other
    cfg.state = previous
    assert cfg.state is previous and cfg.dequantized_from is None


@pytest.mark.parametrize("current,new", ILLEGAL, ids=lambda s: s.name)
def test_illegal_transitions_raise_naming_tensor_and_states(current, new):
    cfg = in_state(current)
    before = (cfg.state, cfg.masters, cfg.scale)
    with pytest.raises(QuantizationStateError) as info:
        move(cfg, new)
    message = str(info.value)
    assert "'victim'" in message and f"{current.name} -> {new.name}" in message
    assert (cfg.state, cfg.masters) == before[:2]  # nothing changed


def test_soi_is_terminal_until_reset():
    cfg = in_state(S.SOI)
    for new in S:
        with pytest.raises(QuantizationStateError, match="SOI"):
            cfg.state = new
    with pytest.raises(QuantizationStateError):
        cfg.scale = 0.1
    cfg.reset()
    assert cfg.state is S.INITIAL and cfg.scale is None and cfg.masters == ()


def test_preconditions():
    cfg = TensorQuantizationConfig(PT_SYM, name="x")
    with pytest.raises(QuantizationStateError, match="'x'.*no scale"):
        cfg.state = S.ACTIVATED
    with pytest.raises(QuantizationStateError, match="'x'.*dominated_by"):
        cfg.state = S.SLAVE
    with pytest.raises(QuantizationStateError, match="'x'.*neither masters nor a scale"):
        cfg.state = S.PASSIVE
    with pytest.raises(QuantizationStateError, match="cannot be created"):
        TensorQuantizationConfig(PT_SYM, name="y", state=S.SLAVE)
    with pytest.raises(QuantizationStateError, match="without a scale"):
        TensorQuantizationConfig(PT_SYM, name="y", state=S.ACTIVATED)


def test_predicates():
    assert {s for s in S if is_applied(s)} == {S.ACTIVATED, S.SLAVE, S.PASSIVE}
    assert {s for s in S if is_baked(s)} == {S.BAKED, S.PASSIVE_BAKED}
    assert {s for s in S if is_governed(s)} == {S.OVERLAPPED, S.SLAVE, S.PASSIVE, S.PASSIVE_INIT, S.PASSIVE_BAKED}
    assert {s for s in S if is_dequantizable(s)} == set(STATE_TRANSITIONS[S.DEQUANTIZED])


# --------------------------------------------------------------- masters
def test_slave_follows_master_and_its_grid():
    master = tqc("concat_out", scale=0.5, offset=3, policy=PT_ASYM, state=S.ACTIVATED)
    slave = tqc("concat_in", scale=1.0, policy=PT_SYM, num_of_bits=4)
    slave.dominated_by(master, S.SLAVE)
    assert slave.scale == 0.5 and slave.offset == 3
    assert (slave.num_of_bits, slave.quant_min, slave.quant_max, slave.policy) == (8, 0, 255, PT_ASYM)
    master.scale = 0.125
    master.offset = 7
    assert slave.scale == 0.125 and slave.offset == 7
    x = np.linspace(-3, 3, 13)
    np.testing.assert_array_equal(slave.fake_quantize(x), master.fake_quantize(x))
    for action in (lambda: setattr(slave, "scale", 0.3), lambda: setattr(slave, "offset", 1),
                   lambda: setattr(slave, "num_of_bits", 16), lambda: slave.set_range(0, 15),
                   lambda: setattr(slave, "channel_axis", 0), lambda: setattr(slave, "policy", PT_SYM)):
        with pytest.raises(QuantizationStateError, match="'concat_in'.*concat_out"):
            action()


def test_three_long_chain_follows_the_root():
    root = tqc("root", scale=0.5, state=S.ACTIVATED)
    mid = tqc("mid")
    leaf = tqc("leaf")
    mid.dominated_by(root, S.SLAVE)
    leaf.dominated_by(mid, S.OVERLAPPED)
    assert leaf.scale == 0.5
    root.scale = 0.03125
    assert leaf.scale == mid.scale == np.float32(0.03125)
    assert leaf.master is mid and mid.master is root
    with pytest.raises(QuantizationStateError, match="cycle"):
        root.dominated_by(leaf, S.SLAVE)
    with pytest.raises(QuantizationStateError, match="cycle"):
        mid.dominated_by(mid, S.SLAVE)
    assert root.state is S.ACTIVATED and root.masters == ()


def test_per_channel_master_makes_per_channel_slave():
    master = tqc("w", scale=[0.1, 0.2, 0.4], policy=PC_SYM, channel_axis=1, state=S.ACTIVATED)
    slave = tqc("w2", scale=0.5)
    slave.dominated_by(master, S.OVERLAPPED)
    assert slave.policy.per_channel and slave.channel_axis == 1
    np.testing.assert_array_equal(slave.scale, np.float32([0.1, 0.2, 0.4]))
    x = np.ones((2, 3), dtype=np.float32)
    np.testing.assert_array_equal(slave.fake_quantize(x), fake_quantize(x, master.scale, 0, -128, 127,
                                                                       channel_axis=1))


def test_passive_bias_scale_is_live_product_of_masters():
    x = tqc("x", scale=0.5, state=S.ACTIVATED)
    w = tqc("w", scale=[0.25, 0.125], policy=PC_SYM, channel_axis=0, state=S.ACTIVATED)
    bias = TensorQuantizationConfig(PT_SYM, num_of_bits=32, channel_axis=0, name="b", state=S.PASSIVE_INIT)
    bias.dominated_by([x, w], S.PASSIVE)
    np.testing.assert_array_equal(bias.scale, np.float32([0.125, 0.0625]))
    assert bias.offset.tolist() == [0, 0] and bias.quant_min == -2 ** 31
    w.scale = [1.0, 2.0]
    np.testing.assert_array_equal(bias.scale, np.float32([0.5, 1.0]))
    q = bias.quantize(np.array([3.0, -5.0]))
    assert q.tolist() == [6, -5] and q.dtype == np.int32
    with pytest.raises(QuantizationStateError, match="'b'.*masters"):
        bias.scale = 0.1
    bias.state = S.PASSIVE_BAKED
    assert bias.masters == (x, w)
    clip = tqc("clip")
    clip.dominated_by(x, S.PASSIVE)  # one master: its scale and offset
    assert clip.scale == 0.5


def test_leaving_governed_state_drops_masters_and_detach_adopts():
    master = tqc("m", scale=0.5, offset=0, state=S.ACTIVATED)
    cfg = tqc("c", scale=0.25)
    cfg.dominated_by(master, S.SLAVE)
    cfg.state = S.FP32
    assert cfg.masters == () and cfg.scale == 0.25  # its own value again
    cfg2 = TensorQuantizationConfig(PT_SYM, name="c2")
    cfg2.dominated_by(master, S.SLAVE)
    with pytest.raises(QuantizationStateError, match="no scale"):
        cfg2.state = S.ACTIVATED
    cfg2.detach()
    assert cfg2.state is S.ACTIVATED and cfg2.masters == () and cfg2.scale == 0.5
    master.scale = 1.0
    assert cfg2.scale == 0.5  # detached: now its own


# ----------------------------------------------------------- dequantized
@pytest.mark.parametrize("previous", [S.ACTIVATED, S.BAKED, S.SLAVE, S.PASSIVE, S.PASSIVE_BAKED],
                         ids=lambda s: s.name)
def test_dequantized_restore_is_exact(previous):
    cfg = in_state(previous)
    masters, scale, offset = cfg.masters, cfg.scale, cfg.offset
    cfg.set_dequantized()
    assert cfg.state is S.DEQUANTIZED and cfg.dequantized_from is previous
    with pytest.raises(QuantizationStateError):
        cfg.set_dequantized()
    with pytest.raises(QuantizationStateError):
        cfg.scale = 0.3
    cfg.restore()
    assert cfg.state is previous and cfg.masters == masters
    np.testing.assert_array_equal(cfg.scale, scale)
    np.testing.assert_array_equal(cfg.offset, offset)
    with pytest.raises(QuantizationStateError, match="restore"):
        cfg.restore()


def test_only_effective_states_can_be_dequantized():
    for state in (S.INITIAL, S.OVERLAPPED, S.SOI, S.FP32, S.PASSIVE_INIT, S.DEACTIVATED):
        with pytest.raises(QuantizationStateError, match="'victim'.*-> DEQUANTIZED"):
            in_state(state).set_dequantized()


# -------------------------------------------------------------- policies
@pytest.mark.parametrize("flags,missing", [
    (Q.PER_TENSOR | Q.SYMMETRICAL, "LINEAR"),
    (Q.PER_TENSOR | Q.PER_CHANNEL | Q.LINEAR | Q.SYMMETRICAL, "PER_TENSOR, PER_CHANNEL"),
    (Q.LINEAR | Q.SYMMETRICAL, "PER_TENSOR, PER_CHANNEL"),
    (Q.PER_TENSOR | Q.LINEAR | Q.SYMMETRICAL | Q.ASYMMETRICAL, "SYMMETRICAL, ASYMMETRICAL"),
    (Q.PER_TENSOR | Q.LINEAR | Q.POWER_OF_2, "SYMMETRICAL, ASYMMETRICAL"),
])
def test_policy_validation(flags, missing):
    with pytest.raises(QuantizationPolicyError) as info:
        QuantizationPolicy(flags)
    assert missing in str(info.value)
    shown = "|".join(p.name for p in (Q.PER_TENSOR, Q.PER_CHANNEL, Q.LINEAR, Q.POWER_OF_2, Q.SYMMETRICAL,
                                      Q.ASYMMETRICAL) if p in flags)
    assert shown in str(info.value)


def test_policy_api():
    p = QuantizationPolicy(Q.PER_CHANNEL | Q.LINEAR | Q.SYMMETRICAL | Q.POWER_OF_2)
    assert p.per_channel and p.symmetric and p.power_of_2
    assert p.has_property(Q.LINEAR | Q.POWER_OF_2) and not p.has_property(Q.PER_TENSOR)
    data = json.loads(json.dumps(p.to_dict()))
    assert data == {"properties": ["PER_CHANNEL", "LINEAR", "POWER_OF_2", "SYMMETRICAL"]}
    assert QuantizationPolicy.from_dict(data) == p and QuantizationPolicy.from_dict(data["properties"]) == p
    assert hash(QuantizationPolicy(["LINEAR", "SYMMETRICAL", "PER_CHANNEL", "POWER_OF_2"])) == hash(p)
    assert p != PC_SYM and len({p, PC_SYM, QuantizationPolicy(p.flags)}) == 2
    with pytest.raises(QuantizationPolicyError, match="SIDEWAYS"):
        QuantizationPolicy(["LINEAR", "SIDEWAYS"])
    with pytest.raises(QuantizationPolicyError, match="channel_axis"):
        TensorQuantizationConfig(PC_SYM, name="w")


# --------------------------------------------------------------- configs
def test_defaults_bits_and_validation():
    assert (tqc(policy=PT_SYM).quant_min, tqc(policy=PT_SYM).quant_max) == (-128, 127)
    assert (tqc(policy=PT_ASYM).quant_min, tqc(policy=PT_ASYM).quant_max) == (0, 255)
    narrow = tqc(quant_min=-127, quant_max=127)
    narrow.num_of_bits = 4
    assert (narrow.quant_min, narrow.quant_max) == (-7, 7)
    with pytest.raises(QuantizationStateError, match="fit"):
        tqc(quant_min=-128, quant_max=200)
    with pytest.raises(QuantizationStateError, match="outside"):
        tqc(policy=PT_ASYM, offset=300)
    with pytest.raises(QuantizationStateError, match="scale"):
        tqc(scale=0.0)
    with pytest.raises(QuantizationStateError, match="per-tensor"):
        tqc(scale=[0.1, 0.2])
    cfg = tqc(scale=0.5)
    with pytest.raises(ValueError):
        cfg.scale[...] = 2.0  # stored read-only: no stale in-place edits


def test_numerics_delegation_and_rounding():
    cfg = tqc(scale=0.5, offset=3, policy=PT_ASYM, rounding=RoundingPolicy.ROUND_HALF_UP, state=S.ACTIVATED)
    x = np.array([-0.25, 0.25, 0.75, 200.0], dtype=np.float32)
    q = cfg.quantize(x)
    assert q.tolist() == quantize(x, np.float32(0.5), 3, 0, 255, RoundingPolicy.ROUND_HALF_UP).tolist()
    assert q.tolist() == [3, 4, 5, 255]
    np.testing.assert_array_equal(cfg.dequantize(q), cfg.fake_quantize(x))
    with pytest.raises(QuantizationStateError, match="'fresh'.*no scale"):
        TensorQuantizationConfig(PT_SYM, name="fresh").fake_quantize(x)


def test_to_dict_from_dict_round_trip():
    w = tqc("w", scale=[0.1, 0.2], policy=PC_SYM, channel_axis=0, quant_min=-127, quant_max=127,
            state=S.ACTIVATED, detail={"note": 1})
    slave = tqc("s")
    slave.dominated_by(w, S.SLAVE)
    data = json.loads(json.dumps(slave.to_dict()))
    assert data["scale"] == [float(np.float32(0.1)), float(np.float32(0.2))] and data["offset"] == [0, 0]
    assert data["state"] == "SLAVE" and data["masters"] == ["w"] and data["channel_axis"] == 0
    alone = TensorQuantizationConfig.from_dict(data)
    assert alone.state is S.SLAVE and alone.masters == () and alone.quant_min == -127
    np.testing.assert_array_equal(alone.scale, w.scale)
    linked = TensorQuantizationConfig.from_dict(data, lookup={"w": w}.__getitem__)
    assert linked.master is w
    w.scale = [1.0, 2.0]
    np.testing.assert_array_equal(linked.scale, [1.0, 2.0])
    w_back = TensorQuantizationConfig.from_dict(json.loads(json.dumps(w.to_dict())))
    assert w_back.to_dict() == w.to_dict() and w_back.detail == {"note": 1}
    assert "w" in repr(w) and "ACTIVATED" in repr(w)


def test_copy_is_independent_but_shares_masters():
    master = tqc("m", state=S.ACTIVATED)
    cfg = tqc("c", detail={"k": [1]})
    cfg.dominated_by(master, S.OVERLAPPED)
    dup = cfg.copy()
    assert dup is not cfg and dup.master is master and dup.state is S.OVERLAPPED
    dup.detail["k"].append(2)
    assert cfg.detail == {"k": [1]}
    dup.state = S.FP32
    assert cfg.state is S.OVERLAPPED


def test_operation_config():
    x, w, y = tqc("x", state=S.ACTIVATED), tqc("w", state=S.ACTIVATED), tqc("y", state=S.ACTIVATED)
    b = TensorQuantizationConfig(PT_SYM, num_of_bits=32, name="b")
    b.dominated_by([x, w], S.PASSIVE)
    op = OperationQuantizationConfig([x, w, b, None], [y])
    assert [(side, i, c.name) for side, i, c in op.iter_configs()] == [
        ("input", 0, "x"), ("input", 1, "w"), ("input", 2, "b"), ("output", 0, "y")]
    assert [c.name for c in op.all_configs()] == ["x", "w", "b", "y"]
    assert [(t, c.name) for t, c in op.pairs(["X", "W", "B", "shape"], ["Y"])] == [
        ("X", "x"), ("W", "w"), ("B", "b"), ("Y", "y")]
    with pytest.raises(QuantizationStateError):
        list(op.pairs(["X"], ["Y"]))
    dup = op.copy()
    new_b = dup.input_quantization_config[2]
    assert new_b.masters == (dup.input_quantization_config[0], dup.input_quantization_config[1])
    assert dup.input_quantization_config[3] is None
    data = json.loads(json.dumps(op.to_dict()))
    back = OperationQuantizationConfig.from_dict(data)
    assert back.input_quantization_config[3] is None and back.input_quantization_config[2].scale == 0.25
    assert "PASSIVE" in repr(op)


def test_grid_changes_are_checked():
    cfg = tqc("a", scale=0.5, offset=200, policy=PT_ASYM, state=S.ACTIVATED)
    with pytest.raises(QuantizationStateError, match="'a'.*outside the new range"):
        cfg.num_of_bits = 4
    assert (cfg.num_of_bits, cfg.quant_max) == (8, 255)
    cfg.offset = 3
    cfg.num_of_bits = 4
    assert (cfg.quant_min, cfg.quant_max) == (0, 15)
    cfg.state = S.BAKED
    with pytest.raises(QuantizationStateError, match="'a' is BAKED"):
        cfg.num_of_bits = 8
    with pytest.raises(QuantizationStateError, match="'a' is BAKED"):
        cfg.set_range(0, 7)


def test_revision_changes_with_every_change_and_is_never_shared():
    """``revision`` (what the executor keeps derived facts under) moves with every assignment to a config or
    to its masters, stays put otherwise, and copies and unpickled configs take numbers of their own."""
    import copy
    import pickle
    from ppqlike.core.requantization import IntegerRequantization
    master = tqc("m", scale=0.125, state=S.ACTIVATED)
    slave = tqc("s", scale=0.25)
    slave.dominated_by(master, S.SLAVE)
    seen = [master.revision, slave.revision]
    assert master.revision == seen[0] and master.scale is not None and master.revision == seen[0]   # reads: no
    for change in (lambda: setattr(master, "scale", 0.0625), lambda: master.set_scale_offset(0.5, 0),
                   lambda: setattr(master, "requantization", IntegerRequantization.from_arrays([3], [2], [1.0], 1)),
                   lambda: setattr(master, "rounding", RoundingPolicy.ROUND_HALF_UP),
                   lambda: setattr(master, "state", S.BAKED)):
        change()
        assert slave.revision not in seen and master.revision not in seen   # the slave moves with its master
        seen += [master.revision, slave.revision]
    copies = [copy.copy(master), copy.deepcopy(master), pickle.loads(pickle.dumps(master)), master.copy()]
    assert len({c.revision for c in copies} | {master.revision}) == 5
    assert all(float(c.scale) == float(master.scale) for c in copies)
