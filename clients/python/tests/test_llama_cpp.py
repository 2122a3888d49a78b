"""llama-cpp-python with the sidecar (SIDECAR_ADDR, an index of SmolLM2's tokenizer; SIDECAR_GGUF, the
SmolLM2 GGUF): greedy decoding with sidecar drafts emits exactly plain decoding's tokens, and the
logits processor at λ = 0 changes nothing while at λ = 1 it follows the ∞-gram; after a refused call
or an ended stream, the next call's sidecar sequence is its tokens again."""
import os
import unittest

from llama_cpp import Llama

from infini_sidecar import InvalidArgument, Sidecar, SidecarError
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

    def test_drafter_goes_on_after_a_refused_call(self):
        """A refused call (a token outside the vocabulary, after a rollback the sidecar did) raises, and
        so does one whose stream ended; each next call's sequence is exactly its tokens: it is as long
        and drafts as the unary Draft of those tokens does."""
        drafter = SidecarDraftModel(self.sidecar, max_tokens=8)
        mirror, ids = drafter.mirror, self.prompts[0]

        def check(tokens):
            result = mirror.step(tokens, draft=drafter.options)
            self.assertEqual(result.state.length, len(tokens))
            self.assertEqual(result.draft, self.sidecar.draft(context=tokens, options=drafter.options))

        check(ids)
        with self.assertRaises(InvalidArgument):
            drafter(ids[:-1] + [10**9])
        check(ids + self.prompts[1][:2])
        mirror.batch.close()  # the stream ends under it, as a timeout or a sidecar gone would end it
        with self.assertRaises(SidecarError):
            drafter(ids)
        check(ids)
        drafter.close()


if __name__ == "__main__":
    unittest.main()
