"""moex.experts_forward on numpy arrays: every CPU backend against the outputs transformers
recorded for the six fixture architectures, and the boundary's errors (dtype, shape,
contiguity, ids, read-only output, unknown names). Needs numpy only."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import _fixtures  # noqa: E402

import moex  # noqa: E402

CPU_BACKENDS = sorted({b["name"] for b in moex.backends() if "cpu" in b["devices"]})


class ExpertsCases(unittest.TestCase):
    def test_backends_listed(self):
        self.assertTrue({"eager", "batched_mm", "grouped_mm"} <= set(CPU_BACKENDS), CPU_BACKENDS)
        for b in moex.backends():
            self.assertTrue(b["devices"] and b["dtypes"] and b["description"], b)

    def test_env_switches_listed_and_checked(self):
        names = {s["name"]: s for s in moex.env_switches()}
        self.assertIn("MOEX_PDL", names)
        self.assertTrue(all(s["accepts"] and s["meaning"] for s in names.values()), names)
        old = os.environ.get("MOEX_NORM_GEMV")
        os.environ["MOEX_NORM_GEMV"] = "maybe"
        try:
            self.assertEqual({s["name"]: s["value"] for s in moex.env_switches()}["MOEX_NORM_GEMV"], "maybe")
            with self.assertRaisesRegex(moex.InvalidInput, 'MOEX_NORM_GEMV="maybe".*0 or 1'):
                moex.Experts(np.zeros((2, 8, 4), np.float32), np.zeros((2, 4, 4), np.float32))
        finally:
            if old is None:
                del os.environ["MOEX_NORM_GEMV"]
            else:
                os.environ["MOEX_NORM_GEMV"] = old

    def test_matches_transformers(self):
        for model in _fixtures.EXPERTS_MODELS:
            w, layout, cases = _fixtures.experts_fixture(model)
            for backend in CPU_BACKENDS:
                for T in (1, 7, 64):
                    with self.subTest(model=model, backend=backend, T=T):
                        out = moex.experts_forward(
                            cases[f"T{T}_hidden"], cases[f"T{T}_top_k_index"], cases[f"T{T}_top_k_weights"],
                            implementation=backend, **w, **layout)
                        self.assertIsInstance(out, np.ndarray)
                        self.assertEqual(out.dtype, np.float32)
                        # transformers ran fp32 with its own summation order: float32 accuracy.
                        self.assertLessEqual(_fixtures.rel_l2(out, cases[f"T{T}_out"]), 1e-5)

    def test_reusable_module_and_out(self):
        w, layout, cases = _fixtures.experts_fixture("qwen2_moe")
        experts = moex.Experts(w["gate_up_proj"], w["down_proj"], **layout)
        self.assertEqual((experts.device, experts.dtype), ("cpu", "float32"))
        for T in (1, 7, 64):
            out = np.full((T, w["down_proj"].shape[1]), np.nan, np.float32)
            experts.forward("grouped_mm", cases[f"T{T}_hidden"], cases[f"T{T}_top_k_index"],
                            cases[f"T{T}_top_k_weights"], out)
            self.assertLessEqual(_fixtures.rel_l2(out, cases[f"T{T}_out"]), 1e-5)

    def test_int32_ids_sentinels_and_zero_tokens(self):
        w, layout, cases = _fixtures.experts_fixture("olmoe")
        E = w["gate_up_proj"].shape[0]
        h, idx, tw = cases["T7_hidden"], cases["T7_top_k_index"], cases["T7_top_k_weights"]
        ref = moex.experts_forward(h, idx, tw, **w, **layout)
        got = moex.experts_forward(h, idx.astype(np.int32), tw, **w, **layout)
        np.testing.assert_array_equal(got, ref)
        # An id >= E is an expert-parallel sentinel: that slot contributes nothing.
        masked = idx.copy()
        masked[:, 1] = E
        only_first = tw.copy()
        only_first[:, 1] = 0
        np.testing.assert_allclose(moex.experts_forward(h, masked, tw, **w, **layout),
                                   moex.experts_forward(h, idx, only_first, **w, **layout), rtol=1e-6, atol=1e-7)
        empty = moex.experts_forward(h[:0], idx[:0], tw[:0], **w, **layout)
        self.assertEqual(empty.shape, (0, h.shape[1]))

    def test_no_copy_of_readonly_inputs(self):
        w, layout, cases = _fixtures.experts_fixture("mixtral")
        args = [cases["T7_hidden"], cases["T7_top_k_index"], cases["T7_top_k_weights"]]
        for a in args + list(w.values()):
            a.setflags(write=False)  # read-only inputs are fine (buffer protocol, no copy)
        out = moex.experts_forward(*args, **w, **layout)
        self.assertLessEqual(_fixtures.rel_l2(out, cases["T7_out"]), 1e-5)


class ExpertsErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w, cls.layout, cases = _fixtures.experts_fixture("qwen3_moe")
        cls.h, cls.idx, cls.tw = cases["T7_hidden"], cases["T7_top_k_index"], cases["T7_top_k_weights"]

    def call(self, h=None, idx=None, tw=None, **kw):
        args = dict(self.w, **self.layout)
        args.update(kw)
        return moex.experts_forward(self.h if h is None else h, self.idx if idx is None else idx,
                                    self.tw if tw is None else tw, **args)

    def test_wrong_dtype(self):
        with self.assertRaisesRegex(moex.InvalidInput, "hidden is float64 but the expert weights are float32"):
            self.call(h=self.h.astype(np.float64))
        with self.assertRaisesRegex(ValueError, "top_k_index must be int64 or int32"):
            self.call(idx=self.idx.astype(np.float32))
        with self.assertRaisesRegex(TypeError, "hidden: unsupported element type"):
            self.call(h=self.h.astype(np.complex64))
        with self.assertRaisesRegex(TypeError, "top_k_index: unsupported element type"):
            self.call(idx=self.idx.astype(np.uint32))
        with self.assertRaisesRegex(TypeError, "hidden: expected an array"):
            self.call(h=[[1.0] * 128])

    def test_wrong_shape(self):
        with self.assertRaisesRegex(ValueError, r"hidden must be \[T, 128\]"):
            self.call(h=self.h[:, :64].copy())
        with self.assertRaisesRegex(ValueError, r"top_k_index must be \[7, k\]"):
            self.call(idx=self.idx[:3].copy())
        with self.assertRaisesRegex(ValueError, "gate_up_proj must be 3-D"):
            self.call(gate_up_proj=self.w["gate_up_proj"][0].copy())
        # I is read from down_proj, so gate_up_proj is the one that disagrees.
        with self.assertRaisesRegex(ValueError, r"experts weight 'gate_up_proj' has shape \[8, 128, 128\], expected \[8, 64, 128\]"):
            self.call(down_proj=self.w["down_proj"][:, :, :32].copy())
        with self.assertRaisesRegex(ValueError, "give both gate_up_proj_bias and down_proj_bias"):
            self.call(gate_up_proj_bias=np.zeros((8, 128), np.float32))

    def test_non_contiguous(self):
        wide = np.zeros((7, 256), np.float32)
        with self.assertRaisesRegex(ValueError, "hidden must be contiguous"):
            self.call(h=wide[:, ::2])
        with self.assertRaisesRegex(ValueError, "gate_up_proj must be contiguous"):
            self.call(gate_up_proj=np.asfortranarray(self.w["gate_up_proj"]))
        with self.assertRaisesRegex(ValueError, "negative strides"):
            self.call(h=self.h[::-1])

    def test_ids_out_of_range(self):
        bad = self.idx.copy()
        bad[3, 1] = -1
        with self.assertRaisesRegex(moex.InvalidInput, r"top_k_index\[3, 1\] = -1 is negative"):
            self.call(idx=bad)

    def test_bad_out(self):
        out = np.empty((7, 128), np.float32)
        out.setflags(write=False)
        with self.assertRaisesRegex(ValueError, "out: the array is read-only"):
            self.call(out=out)
        with self.assertRaisesRegex(ValueError, "experts output must be a contiguous float32 tensor of shape"):
            self.call(out=np.empty((7, 64), np.float32))

    def test_unknown_names(self):
        with self.assertRaisesRegex(moex.UnknownName, "unknown experts backend 'nope'; registered: "):
            self.call(implementation="nope")
        with self.assertRaisesRegex(ValueError, "unknown activation 'tanh'"):
            self.call(activation="tanh")
        self.assertTrue(issubclass(moex.Unsupported, NotImplementedError))
        self.assertTrue(issubclass(moex.Error, RuntimeError))


if __name__ == "__main__":
    _fixtures.main()
