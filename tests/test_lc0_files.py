"""tests/lc0_files.py itself: the writer, its policy map and its reference forward pass.

The files are read back with the protobuf walker of the project's codec
(``engine.lc0_proto.walk``; not ``engine.lc0``'s reading of lc0's format, not the
``protobuf`` package) and the layer decoding here.  The same walker reads the
repository's lc0 fixture (``tests/data/lc0/``: a network ``cyzero-train export
--lc0`` wrote, with lc0 v0.32.1's outputs for it) and, where a user has it, Maia
1100 (a network lc0's own trainer wrote; an extra, see ``lc0_files.MAIA``), and
the reference forward pass on each is compared with lc0's own ONNX export of
the file and with lc0's own evaluations: that pins the semantics the reference
is written from (BN variances, SE layout, policy map, value and moves-left
heads) to lc0's.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import pytest

import lc0_files as L
from engine.lc0_proto import walk
from lc0_files import CYZERO, EVALUATED_BY_LC0, Lc0Fixture, Lc0Spec, assert_plays_as_lc0, fixture_params, \
    make_lc0, reference_forward


# --------------------------------------------------------------------------- the protobuf walker

def fields(buf):
    """[(field, wire_type, value)]: ints for varint / fixed32 / fixed64, bytes for length-delimited
    (the codec's walker, its fixed payloads read as unsigned ints)."""
    return [(field, wire, struct.unpack("<I" if wire == 5 else "<Q", value)[0] if wire in (1, 5) else value)
            for field, wire, _, value in walk(buf)]


def one(buf, field):
    found = [v for f, _, v in fields(buf) if f == field]
    assert len(found) <= 1, (field, len(found))
    return found[0] if found else None


def as_float(u32):
    return struct.unpack("<f", struct.pack("<I", u32))[0]


def decode_layer(buf):
    lo, hi, params, encoding = one(buf, 1), one(buf, 2), one(buf, 3) or b"", one(buf, 4) or 1
    if encoding == 1:
        q = np.frombuffer(params, "<u2").astype(np.float64) / 65535.0
        lo, hi = as_float(lo), as_float(hi)
        return (lo * (1.0 - q) + hi * q).astype(np.float32)
    if encoding == 2:
        return np.frombuffer(params, "<f2").astype(np.float32)
    if encoding == 3:
        return (np.frombuffer(params, "<u2").astype("<u4") << 16).view("<f4").astype(np.float32)
    if encoding == 4:
        return np.frombuffer(params, "<f4").astype(np.float32)
    raise ValueError(f"layer encoding {encoding}")


CONV_FIELDS = {1: "weights", 2: "biases", 3: "bn_means", 4: "bn_stddivs", 5: "bn_gammas", 6: "bn_betas"}
SE_FIELDS = {1: "w1", 2: "b1", 3: "w2", 4: "b2"}
# An EncoderLayer's fields (its MHA's and FFN's in their own messages), named as lc0_files names them.
ENCODER_FIELDS = {2: "ln1_gammas", 3: "ln1_betas", 5: "ln2_gammas", 6: "ln2_betas"}
MHA_FIELDS = {1: "q_w", 2: "q_b", 3: "k_w", 4: "k_b", 5: "v_w", 6: "v_b", 7: "dense_w", 8: "dense_b"}
FFN_FIELDS = {1: "dense1_w", 2: "dense1_b", 3: "dense2_w", 4: "dense2_b"}
WEIGHT_CONVS = {1: "input", 3: "policy", 6: "value", 11: "policy1", 12: "moves_left"}
WEIGHT_LAYERS = {4: "ip_pol_w", 5: "ip_pol_b", 7: "ip1_val_w", 8: "ip1_val_b", 9: "ip2_val_w", 10: "ip2_val_b",
                 13: "ip1_mov_w", 14: "ip1_mov_b", 15: "ip2_mov_w", 16: "ip2_mov_b", 25: "ip_emb_w", 26: "ip_emb_b",
                 17: "ip2_pol_w", 18: "ip2_pol_b", 19: "ip3_pol_w", 20: "ip3_pol_b", 22: "ip4_pol_w"}


def decode_weights(buf):
    """Flat float32 arrays keyed like lc0_files' weights (the attention policy's own encoder layers
    included), plus the raw other fields (27 encoders, 28 headcount, 24 the policy encoders' heads)."""
    flat, other, block, pol_encoder = {}, {}, 0, 0

    def conv(name, sub):
        for f, _, v in fields(sub):
            flat[f"{name}.{CONV_FIELDS[f]}"] = decode_layer(v)

    for f, _, v in fields(buf):
        if f in WEIGHT_CONVS:
            conv(WEIGHT_CONVS[f], v)
        elif f in WEIGHT_LAYERS:
            flat[WEIGHT_LAYERS[f]] = decode_layer(v)
        elif f == 2:
            for rf, _, rv in fields(v):
                if rf == 3:
                    for sf, _, sv in fields(rv):
                        flat[f"residual.{block}.se.{SE_FIELDS[sf]}"] = decode_layer(sv)
                else:
                    conv(f"residual.{block}.conv{rf}", rv)
            block += 1
        elif f == 21:
            name = f"pol_encoder.{pol_encoder}"
            for ef, _, ev in fields(v):
                if ef in (1, 4):
                    for sf, _, sv in fields(ev):
                        part = "mha" if ef == 1 else "ffn"
                        flat[f"{name}.{part}.{(MHA_FIELDS if ef == 1 else FFN_FIELDS)[sf]}"] = decode_layer(sv)
                else:
                    flat[f"{name}.{ENCODER_FIELDS[ef]}"] = decode_layer(ev)
            pol_encoder += 1
        else:
            other.setdefault(f, []).append(v)
    return flat, other


def shape_weights(flat):
    """Give the flat arrays their shapes (conv [out,in,k,k], dense [out,in]) from the per-channel layers."""
    def channels(name):
        return len(flat.get(f"{name}.biases", flat.get(f"{name}.bn_means")))

    filters = channels("input")
    shaped = dict(flat)
    for key, w in flat.items():
        if key.endswith(".weights"):
            name = key[: -len(".weights")]
            out_ch, in_ch = channels(name), 112 if name == "input" else filters
            k = int(round(np.sqrt(w.size / (out_ch * in_ch))))
            shaped[key] = w.reshape(out_ch, in_ch, k, k)
        elif key == "ip4_pol_w":      # the attention policy's promotion offsets: [4, d_model], no bias
            shaped[key] = w.reshape(4, -1)
        elif key.endswith("_w"):
            shaped[key] = w.reshape(len(flat[key[:-1] + "b"]), -1)
        elif key.endswith((".w1", ".w2")):
            bias = flat[key[:-2] + "b" + key[-1]]
            shaped[key] = w.reshape(len(bias), -1)
    return shaped


def decode_net(data):
    top = {f: v for f, _, v in fields(data)}
    flat, other = decode_weights(top[10]) if 10 in top else ({}, {})
    return top, shape_weights(flat) if flat else {}, other


def network_format(data):
    """{field: value} of Net.format.network_format, or None when the file has none."""
    fmt = one(data, 4)
    nf = one(fmt, 2) if fmt is not None else None
    return None if nf is None else {f: v for f, _, v in fields(nf)}


# --------------------------------------------------------------------------- the policy map

def test_policy_map_is_lc0s_mapping_table():
    onnx = pytest.importorskip("onnx", reason="reads the fixture with onnx: pip install 'cyzero[train]'")
    from onnx import numpy_helper

    model = onnx.load(CYZERO.need().onnx)
    table = [numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "/const/mapping_table"]
    assert len(table) == 1
    assert table[0].shape == (1858,)
    np.testing.assert_array_equal(L.POLICY_MAP, table[0].astype(np.int64))


# --------------------------------------------------------------------------- the encoder

def test_varints():
    assert L.varint(0) == b"\x00"
    assert L.varint(1) == b"\x01"
    assert L.varint(127) == b"\x7f"
    assert L.varint(300) == b"\xac\x02"
    assert L.varint(-1) == b"\xff" * 9 + b"\x01"
    assert L.f_fixed32(1, 0x1C0) == b"\x0d\xc0\x01\x00\x00"
    assert L.f_bytes(10, b"ab") == b"\x52\x02ab"
    assert fields(L.f_varint(28, 2) + L.f_float(2, 1.5) + L.f_string(6, "x")) == [
        (28, 0, 2), (2, 5, struct.unpack("<I", struct.pack("<f", 1.5))[0]), (6, 2, b"x")]


def test_linear16_dequantization_follows_the_formula():
    values = np.array([[-0.5, 0.25, 0.0], [1.0, -0.125, 0.3333]], dtype=np.float32)
    message, decoded = L.encode_layer(values, "linear16")
    assert one(message, 4) is None  # absent encoding means LINEAR16
    lo, hi = as_float(one(message, 1)), as_float(one(message, 2))
    assert (lo, hi) == (-0.5, 1.0)
    q = np.frombuffer(one(message, 3), "<u2").astype(np.float64)
    assert q[0] == 0 and q[3] == 65535
    expected = lo * (1.0 - q / 65535.0) + hi * q / 65535.0
    np.testing.assert_array_equal(decoded.ravel(), expected.astype(np.float32))
    assert decoded.shape == values.shape
    assert np.abs(decoded - values).max() <= (hi - lo) / 65535.0
    # a constant layer (max == min) is all zeros q and decodes to the constant
    message, decoded = L.encode_layer(np.full(4, 0.7, np.float32), "linear16")
    np.testing.assert_array_equal(decoded, np.full(4, np.float32(0.7)))


@pytest.mark.parametrize("encoding,code,tolerance", [("float16", 2, 1e-3), ("bfloat16", 3, 4e-3), ("float32", 4, 0)])
def test_other_layer_encodings(encoding, code, tolerance):
    values = np.random.default_rng(1).standard_normal(50).astype(np.float32)
    message, decoded = L.encode_layer(values, encoding)
    assert one(message, 4) == code
    assert one(message, 1) is None and one(message, 2) is None
    np.testing.assert_array_equal(decode_layer(message), decoded)
    np.testing.assert_allclose(decoded, values, rtol=tolerance, atol=0)


VARIANTS = [
    Lc0Spec(),
    Lc0Spec(se=True, moves_left=True, activation="mish", encoding="float16", seed=1),
    Lc0Spec(policy="classical", value="classical", encoding="bfloat16", old_bn=True, seed=2),
    Lc0Spec(se=True, se_channels=4, encoding="float32", blocks=1, filters=8, seed=3),
    Lc0Spec(policy="classical", value="classical", with_format=False, seed=4),
    Lc0Spec(policy="classical", value="classical", se=True, network=2, seed=5),
    Lc0Spec(attention=True, seed=6),
    Lc0Spec(input_format=3, blocks=0, seed=7),
]


@pytest.mark.parametrize("spec", VARIANTS, ids=lambda s: f"seed{s.seed}")
def test_files_decode_to_the_weights_returned(spec):
    data, weights = make_lc0(spec)
    assert make_lc0(spec)[0] == data  # deterministic
    top, decoded, other = decode_net(data)
    assert fields(data)[0] == (1, 5, L.MAGIC)
    assert {f for f, _, _ in fields(data)} == {1, 2, 3, 4, 5, 10}
    assert sorted(decoded) == sorted(weights)
    for name, array in weights.items():
        assert array.dtype == np.float32, name
        assert decoded[name].shape == array.shape, name
        np.testing.assert_array_equal(decoded[name], array, err_msg=name)

    nf = network_format(data)
    assert one(one(data, 4), 1) == 1  # weights_encoding LINEAR16
    if not spec.with_format:
        assert nf is None
    else:
        assert nf[1] == spec.input_format
        assert nf[3] == spec.network_value()
        assert nf[4] == {"classical": 1, "convolution": 2}[spec.policy]
        assert nf[5] == {"classical": 1, "wdl": 2}[spec.value]
        assert nf.get(6, 0) == int(spec.moves_left)
        assert nf.get(7, 0) == {"relu": 0, "mish": 1}[spec.activation]
    if spec.attention:
        assert nf[3] == 6
        assert other[28] == [2] and other[27] == [b""] * spec.blocks
        assert weights["ip_emb_w"].shape == (spec.filters, 112)
    else:
        assert not other
    assert sum(k.endswith("conv1.weights") for k in weights) == spec.blocks
    assert any(k.endswith(".se.w1") for k in weights) == spec.se
    assert ("moves_left.weights" in weights) == spec.moves_left
    assert any(k.endswith("bn_gammas") for k in weights) != spec.old_bn
    if spec.se:
        assert weights["residual.0.se.w1"].shape == (spec.se_channels, spec.filters)
        assert weights["residual.0.se.w2"].shape == (2 * spec.filters, spec.se_channels)


def test_spec_refuses_contradictions():
    with pytest.raises(ValueError, match="classical"):
        make_lc0(Lc0Spec(with_format=False))
    with pytest.raises(ValueError, match="se"):
        make_lc0(Lc0Spec(with_format=False, policy="classical", value="classical", se=True))
    with pytest.raises(ValueError, match="disagrees"):
        make_lc0(Lc0Spec(network=1, policy="classical", value="classical", se=True))
    with pytest.raises(ValueError, match="encoding"):
        make_lc0(Lc0Spec(encoding="int8"))


def test_write_lc0_writes_atomically(tmp_path):
    spec = Lc0Spec(seed=9)
    data, weights = make_lc0(spec)
    gz_weights = L.write_lc0(tmp_path / "net.pb.gz", spec)
    L.write_lc0(tmp_path / "net.pb", spec, gz=False)
    assert gzip.decompress((tmp_path / "net.pb.gz").read_bytes()) == data
    assert (tmp_path / "net.pb").read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["net.pb", "net.pb.gz"]
    assert all(np.array_equal(gz_weights[k], weights[k]) for k in weights)


def test_broken_and_foreign_files():
    data, _ = make_lc0(Lc0Spec())
    with pytest.raises(ValueError, match="truncated"):
        fields(L.truncated(data))
    assert fields(L.wrong_magic())[0] == (1, 5, 0x1C1)
    wrapped = L.wrap_onnx(b"not really onnx", output_mlh="/output/mlh")
    top = {f: v for f, _, v in fields(wrapped)}
    assert top[1] == L.MAGIC and 10 not in top
    assert network_format(wrapped)[3] == 5
    model = {f: v for f, _, v in fields(top[11])}
    assert model == {1: b"not really onnx", 2: 1, 3: b"/input/planes", 5: b"/output/wdl",
                     6: b"/output/policy", 7: b"/output/mlh"}


# --------------------------------------------------------------------------- the reference forward pass

def test_conv2d_is_a_same_padded_cross_correlation():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3))
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    naive = np.zeros((2, 4, 8, 8))
    for n in range(2):
        for o in range(4):
            for r in range(8):
                for c in range(8):
                    naive[n, o, r, c] = (padded[n, :, r:r + 3, c:c + 3] * w[o]).sum()
    np.testing.assert_allclose(L.conv2d(x, w), naive, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(L.conv2d(x, w[:, :, 1:2, 1:2]), np.einsum("nchw,oc->nohw", x, w[:, :, 1, 1]),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec", [s for s in VARIANTS if not s.attention], ids=lambda s: f"seed{s.seed}")
def test_reference_forward_shapes(spec):
    _, weights = make_lc0(spec)
    planes = L.random_planes(5, seed=spec.seed)
    policy, wdl, mlh = reference_forward(weights, spec, planes)
    assert policy.shape == (5, 1858) and wdl.shape == (5, 3)
    assert np.isfinite(policy).all() and np.isfinite(wdl).all()
    assert np.all(wdl >= 0)
    np.testing.assert_allclose(wdl.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert policy.std(axis=1).min() > 1e-3  # not degenerate
    if spec.value == "classical":
        assert np.all(wdl[:, 1] == 0)
    if spec.moves_left:
        assert mlh.shape == (5,) and np.all(mlh >= 0) and np.isfinite(mlh).all()
    else:
        assert mlh is None


def test_reference_refuses_attention_nets():
    spec = Lc0Spec(attention=True)
    with pytest.raises(ValueError, match="attention"):
        reference_forward(make_lc0(spec)[1], spec, L.random_planes(1))


def decode_fixture(fixture: Lc0Fixture) -> dict:
    """The fixture's weights as the walker here reads them (not engine.lc0)."""
    with open(fixture.need().pb, "rb") as f:
        top, weights, other = decode_net(gzip.decompress(f.read()))
    assert top[1] == L.MAGIC
    assert other == ({24: [fixture.spec.policy_encoder_heads]} if fixture.spec.policy_encoders else {})
    return weights


@pytest.mark.parametrize("fixture", fixture_params())
def test_reference_matches_lc0s_onnx_export(fixture):
    ort = pytest.importorskip("onnxruntime")
    spec, weights = fixture.spec, decode_fixture(fixture)
    assert weights["input.weights"].shape == (spec.filters, 112, 3, 3)
    assert weights["residual.0.se.w1"].shape == (spec.se_channels, spec.filters)
    assert weights["policy.weights"].shape == (80, spec.filters, 3, 3)
    planes = L.random_planes(4, seed=3)
    policy, wdl, mlh = reference_forward(weights, spec, planes)
    session = ort.InferenceSession(fixture.onnx, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(names, {"/input/planes": planes})))
    np.testing.assert_allclose(policy, out["/output/policy"], rtol=0, atol=2e-3)
    np.testing.assert_allclose(wdl, out["/output/wdl"], rtol=0, atol=1e-4)
    assert (mlh is None) == ("/output/mlh" not in out) == (not spec.moves_left)
    if mlh is not None:
        np.testing.assert_allclose(mlh, out["/output/mlh"].reshape(-1), rtol=0, atol=2e-3)


@pytest.mark.parametrize("fixture", fixture_params(*EVALUATED_BY_LC0))
def test_reference_matches_lc0s_own_evaluations(fixture):
    from engine.encoding import encode_position

    weights = decode_fixture(fixture)
    expected = fixture.lc0()
    planes = np.stack([encode_position(p["fen"]) for p in expected["positions"]])
    # v to lc0's 4 printed decimals, d to its 3 (Maia's printed d strays by up to 0.003 from lc0's own
    # ONNX export's draw probability, which the reference matches to 1e-4, test above), every share
    # to 0.07 points
    assert_plays_as_lc0(expected, *reference_forward(weights, fixture.spec, planes))
