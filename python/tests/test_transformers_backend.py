"""moex's backends inside transformers (moex.transformers.register): the fixture models loaded by
transformers with experts_implementation="moex_*" against transformers' own grouped_mm (fp32:
1e-4 relative L2, bf16: a few bf16 units), greedy generate identical, the same under
torch.compile (one graph: the custom op does not break it), moex.experts_forward on torch
tensors, and the decode-stage switch. Skips (exit 77) without torch and transformers.
MOEX_TEST_DEVICE=cuda runs the models and tensors on the GPU (the moex module must be built with
CUDA); the default is the CPU."""
import contextlib
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import _fixtures  # noqa: E402

try:
    import torch
    import transformers
except ModuleNotFoundError as e:  # CI has neither: every test skips
    if e.name not in ("torch", "transformers"):
        raise
    torch = None
    _missing = str(e)
if torch is not None:
    # With both installed, anything missing below (a transformers without these classes, a broken
    # moex.transformers) is a failure, not a skip.
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    import moex.transformers  # noqa: F401

import moex  # noqa: E402

BF16_TOL = 4.0 * 2.0 ** -8
DEVICE = os.environ.get("MOEX_TEST_DEVICE", "cpu")
needs_torch = unittest.skipIf(torch is None, "torch / transformers not installed")
# The decorators are evaluated without torch too (the class is then skipped as a whole).
no_grad = torch.no_grad if torch is not None else (lambda: (lambda f: f))


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def load(model, impl, kind="fp32"):
    path = os.path.join(_fixtures.HF_TINY, model, f"checkpoint_{kind}")
    cls = AutoModelForImageTextToText if model == "qwen3_vl_moe" else AutoModelForCausalLM
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    return cls.from_pretrained(path, experts_implementation=impl, dtype=dtype).to(DEVICE).eval()


def input_ids(model):
    ref = _fixtures.read_safetensors(os.path.join(_fixtures.HF_TINY, model, "reference.safetensors"))
    return torch.from_numpy(ref["input_ids"]).to(DEVICE)


@needs_torch
class TransformersBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        torch.manual_seed(0)
        cls.names = moex.transformers.register()

    def test_registered(self):
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        self.assertEqual(self.names, ["moex_eager", "moex_batched_mm", "moex_grouped_mm", "moex_auto"])
        for n in self.names:
            self.assertIn(n, list(ALL_EXPERTS_FUNCTIONS))
        self.assertEqual(moex.transformers.register(), self.names)  # idempotent

    @no_grad()
    def test_logits_and_greedy_fp32(self):
        for model in _fixtures.MODELS:
            ids = input_ids(model)
            expected = load(model, "grouped_mm")(ids).logits
            for impl in self.names:
                with self.subTest(model=model, impl=impl):
                    m = load(model, impl)
                    self.assertEqual(m.get_experts_implementation()[""], impl)
                    self.assertLessEqual(rel_l2(m(ids).logits, expected), 1e-4)
            with self.subTest(model=model, generate="greedy"):
                ref_model = load(model, "grouped_mm")
                a = ref_model.generate(ids[:1], max_new_tokens=12, do_sample=False)
                b = m.generate(ids[:1], max_new_tokens=12, do_sample=False)
                self.assertTrue(torch.equal(a, b), f"{model}: {a.tolist()} != {b.tolist()}")

    @no_grad()
    def test_logits_bf16(self):
        for model in _fixtures.EXPERTS_MODELS:
            with self.subTest(model=model):
                ids = input_ids(model)
                expected = load(model, "grouped_mm", "bf16")(ids).logits.float()
                got = load(model, "moex_grouped_mm", "bf16")(ids).logits.float()
                self.assertLessEqual(rel_l2(got, expected), BF16_TOL)

    @no_grad()
    def test_torch_compile(self):
        # fullgraph=True: a graph break (an untraceable call) is an error, not a silent fallback.
        # All seven on CUDA; on CPU inductor compiles C++ for minutes per model, so two of them
        # (one plain, one with gpt-oss' clamped SwiGLU) unless MOEX_TEST_COMPILE_ALL=1.
        every = DEVICE == "cuda" or os.environ.get("MOEX_TEST_COMPILE_ALL") == "1"
        for model in _fixtures.MODELS if every else ("qwen2_moe", "gpt_oss"):
            with self.subTest(model=model):
                torch._dynamo.reset()
                ids = input_ids(model)
                expected = load(model, "grouped_mm")(ids).logits
                m = load(model, "moex_grouped_mm")
                compiled = torch.compile(m, fullgraph=True)
                self.assertLessEqual(rel_l2(compiled(ids).logits, expected), 1e-4)
                m.generation_config.cache_implementation = "static"
                m.forward = torch.compile(m.forward, fullgraph=True)
                a = load(model, "grouped_mm").generate(ids[:1], max_new_tokens=6, do_sample=False)
                b = m.generate(ids[:1], max_new_tokens=6, do_sample=False)
                self.assertTrue(torch.equal(a, b), f"{model}: {a.tolist()} != {b.tolist()}")

    @no_grad()
    def test_experts_forward_on_torch(self):
        w, layout, cases = _fixtures.experts_fixture("gpt_oss")
        t = lambda a: torch.from_numpy(a).to(DEVICE)  # noqa: E731
        params = {k: torch.nn.Parameter(t(v)) for k, v in w.items()}  # requires_grad
        for T in (1, 7, 64):
            out = moex.experts_forward(t(cases[f"T{T}_hidden"]), t(cases[f"T{T}_top_k_index"]),
                                       t(cases[f"T{T}_top_k_weights"]), **params, **layout)
            self.assertIsInstance(out, torch.Tensor)
            self.assertEqual(out.device.type, torch.device(DEVICE).type)
            self.assertLessEqual(rel_l2(out.cpu(), torch.from_numpy(cases[f"T{T}_out"])), 1e-5 if DEVICE == "cpu" else 1e-4)
        hb = t(cases["T7_hidden"]).bfloat16()
        wb = {k: v.detach().bfloat16() for k, v in params.items()}
        out = moex.experts_forward(hb, t(cases["T7_top_k_index"]), t(cases["T7_top_k_weights"]), **wb, **layout)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertLessEqual(rel_l2(out.float().cpu(), torch.from_numpy(cases["T7_out"])), 2e-2)
        with self.assertRaisesRegex(ValueError, "hidden must be contiguous"):
            moex.experts_forward(torch.zeros(7, 256, device=DEVICE)[:, ::2], t(cases["T7_top_k_index"]),
                                 t(cases["T7_top_k_weights"]), **params, **layout)
        # torch tensors are read through their attributes (tensor_import.hpp); the same checks hold.
        with self.assertRaisesRegex(TypeError, "top_k_weights: unsupported element type torch.complex64"):
            moex.experts_forward(t(cases["T7_hidden"]), t(cases["T7_top_k_index"]),
                                 t(cases["T7_top_k_weights"]).to(torch.complex64), **params, **layout)
        with self.assertRaisesRegex(ValueError, "hidden must be contiguous"):
            moex.experts_forward(t(cases["T7_hidden"]).t().contiguous().t(), t(cases["T7_top_k_index"]),
                                 t(cases["T7_top_k_weights"]), **params, **layout)
        # An explicit stream other than torch's current one takes the DLPack road (CUDA) or none
        # (CPU): same result.
        out = moex.experts_forward(t(cases["T7_hidden"]), t(cases["T7_top_k_index"]),
                                   t(cases["T7_top_k_weights"]), **params, **layout, stream=0)
        self.assertLessEqual(rel_l2(out.cpu(), torch.from_numpy(cases["T7_out"])), 1e-5 if DEVICE == "cpu" else 1e-4)

    def test_prepared_state_follows_weight_changes(self):
        with torch.no_grad():
            m = load("olmoe", "moex_grouped_mm")
            ids = input_ids("olmoe")
            before = m(ids).logits
            experts = m.model.layers[0].mlp.experts
            experts.down_proj.mul_(0.5)  # in place: the packed copy must be redone
            after = m(ids).logits
            ref = load("olmoe", "grouped_mm")
            ref.model.layers[0].mlp.experts.down_proj.mul_(0.5)
            self.assertLessEqual(rel_l2(after, ref(ids).logits), 1e-4)
            self.assertGreater(rel_l2(after, before), 1e-4)

    def test_decode_stage_switch(self):
        from transformers.generation.utils import GenerationMixin

        self.assertEqual(moex.transformers.decode_stage_map({"": "moex_grouped_mm", "v": "eager"}, "cuda"),
                         {"": "moex_batched_mm", "v": "eager"})
        self.assertEqual(moex.transformers.decode_stage_map({"": "moex_grouped_mm"}, "cpu"), {"": "moex_grouped_mm"})
        # moex_auto chooses per call size itself: no switch.
        self.assertEqual(moex.transformers.decode_stage_map({"": "moex_auto"}, "cuda"), {"": "moex_auto"})
        seen = []
        state = {"impl": {"": "moex_grouped_mm", "text_config": "moex_grouped_mm"}}
        fake = types.SimpleNamespace(
            device=torch.device("cuda"),
            get_experts_implementation=lambda: dict(state["impl"]),
            set_experts_implementation=lambda v: (seen.append(dict(v)), state.update(impl=dict(v))))
        with GenerationMixin._optimize_model_for_decode(fake):
            self.assertEqual(state["impl"], {"": "moex_batched_mm", "text_config": "moex_batched_mm"})
        self.assertEqual(state["impl"], {"": "moex_grouped_mm", "text_config": "moex_grouped_mm"})
        fake.device = torch.device("cpu")
        with GenerationMixin._optimize_model_for_decode(fake):
            self.assertEqual(state["impl"]["text_config"], "moex_grouped_mm")


if __name__ == "__main__":
    with contextlib.suppress(NameError):
        print("skipping:", _missing)
    _fixtures.main()
