"""llama-cpp-python with the sidecar (SIDECAR_ADDR, an index of SmolLM2's tokenizer; SIDECAR_GGUF, the
SmolLM2 GGUF): greedy decoding with sidecar drafts emits exactly plain decoding's tokens, and the
logits processor at λ = 0 changes nothing while at λ = 1 it follows the ∞-gram."""
import os
import unittest

import numpy as np
from llama_cpp import Llama

from infini_sidecar import Sidecar
from infini_sidecar.llama_cpp import SidecarDraftModel, SidecarLogitsProcessor

ADDR = os.environ.get("SIDECAR_ADDR", "127.0.0.1:50051")
GGUF = os.environ["SIDECAR_GGUF"]
PROMPTS = [
    "The kernel uses a spinlock to protect the list of pending timers, and each CPU keeps its own",
    "def read_config(path):\n    \"\"\"Reads the configuration file at path and returns",
]


def greedy(llm, prompt, n, **kwargs):
    llm.reset()
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, **kwargs)
    return out["choices"][0]["text"]


class LlamaCppTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sidecar = Sidecar(ADDR)
        cls.prompts = [cls.sidecar.tokenize(p) for p in PROMPTS]

    def test_sidecar_drafts_change_no_token(self):
        plain = Llama(GGUF, n_ctx=1024, n_threads=2, verbose=False)
        want = [greedy(plain, p, 48) for p in self.prompts]
        drafter = SidecarDraftModel(self.sidecar, max_tokens=8)
        drafted = Llama(GGUF, n_ctx=1024, n_threads=2, verbose=False, draft_model=drafter)
        got = [greedy(drafted, p, 48) for p in self.prompts]
        self.assertEqual(got, want)
        self.assertGreater(drafter.drafted, 0, "the sidecar drafted nothing")
        drafter.close()

    def test_logits_processor(self):
        llm = Llama(GGUF, n_ctx=1024, n_threads=2, verbose=False)
        prompt = self.prompts[0]
        plain = greedy(llm, prompt, 12)
        neutral = SidecarLogitsProcessor(self.sidecar, rule=0.0)
        self.assertEqual(greedy(llm, prompt, 12, logits_processor=[neutral]), plain)
        self.assertEqual(neutral.calls, 12)
        # λ = 1: each chosen token is one of the ∞-gram's most likely next tokens after the sequence so
        # far (the ∞-gram always has some: at worst the empty suffix matches).
        infgram = SidecarLogitsProcessor(self.sidecar, rule=1.0)
        llm.reset()
        llm.create_completion(prompt, max_tokens=6, temperature=0.0, logits_processor=[infgram])
        # What the processor was last given: the prompt and the first five tokens chosen.
        tokens = infgram.mirror.tokens[len(prompt):]
        self.assertEqual(len(tokens), 5)
        context = list(prompt)
        for t in tokens:
            dist = {e.token: e.prob for e in self.sidecar.next_token_distribution(context).dist}
            # λ is kept just inside 1, so the model breaks the ∞-gram's ties.
            self.assertEqual(dist.get(t), max(dist.values()))
            context.append(t)
        neutral.close()
        infgram.close()


if __name__ == "__main__":
    unittest.main()
