"""The package against a real sidecar (SIDECAR_ADDR, serving the SmolLM2 model and an index of its
tokenizer; started by the Rust integration test `python_client`): typed methods, typed errors, the
Batch stream against sessions, and the lm_eval adapter against the Score RPC. The streams' timeout
is tested against a stalled server of this process's own."""
import math
import os
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

import grpc

from infini_sidecar import (API, BatchStepError, DeadlineExceeded, InvalidArgument, NotFound, Sidecar,
                            lambda_rule, pb, top_k_logprobs)
from infini_sidecar import sidecar_pb2_grpc as pb_grpc
from infini_sidecar.client import draft_options

ADDR = os.environ.get("SIDECAR_ADDR", "127.0.0.1:50051")
TEXT = ("The kernel uses a spinlock to protect the list of pending timers, and each CPU keeps its own "
        "list so that the lock is rarely contended.")


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sidecar = Sidecar(ADDR)
        cls.ids = cls.sidecar.tokenize(TEXT)

    def test_api_version_and_info(self):
        self.assertEqual(API, pb.DESCRIPTOR.package)
        info = self.sidecar.info()
        self.assertGreater(info.index_tokens, 0)
        self.assertEqual(self.sidecar.detokenize(self.ids), TEXT)

    def test_engine_queries_agree(self):
        prompt = self.ids[:3]
        dist = self.sidecar.next_token_distribution(prompt, infinite=False)
        self.assertEqual(dist.prompt_cnt, self.sidecar.count(prompt))
        self.assertEqual(sum(t.cont_cnt for t in dist.dist), dist.prompt_cnt)
        if dist.dist:
            best = max(dist.dist, key=lambda t: t.cont_cnt)
            self.assertEqual(self.sidecar.count(prompt + [best.token]), best.cont_cnt)
        found = self.sidecar.search_documents([[self.ids[:2]]], maxnum=1)
        self.assertEqual(found.cnt, self.sidecar.count(self.ids[:2]))

    def test_generate_and_trace(self):
        made = self.sidecar.generate(self.ids[:4], 12, levels=0, temperature=0.0)
        again = self.sidecar.generate(self.ids[:4], 12, levels=0, temperature=0.0)
        self.assertEqual(list(made.tokens), list(again.tokens))
        self.assertEqual(len(made.steps), len(made.tokens))
        # A passage of the reference data is one span, its count the engine's.
        span_ids = self.ids[:12]
        traced = self.sidecar.trace(span_ids, min_len=2, maxnum=1)
        self.assertEqual(list(traced.ids), span_ids)
        if self.sidecar.count(span_ids[:2]) > 0:
            self.assertTrue(any(s.start == 0 for s in traced.spans))
        for span in traced.spans:
            self.assertEqual(span.count, self.sidecar.count(span_ids[span.start:span.end]))

    def test_hints(self):
        # Without the regulariser, samples repeat with the seed and each comes from a suffix of the
        # positions so far.
        seq = self.ids[:12]
        kept = self.sidecar.hints([seq], samples=4, keep_own_copies=True, seed=7)
        again = self.sidecar.hints([seq], samples=4, keep_own_copies=True, seed=7)
        self.assertEqual(kept, again)
        positions = kept.sequences[0].positions
        self.assertEqual(len(positions), len(seq))
        for end, hint in enumerate(positions, start=1):
            self.assertEqual(hint.suffix_len, min(end, hint.suffix_len))
            self.assertEqual(len(hint.tokens), 4 if hint.count else 0)
        exact = self.sidecar.hints([seq], samples=3, exact=True).sequences[0].positions
        self.assertTrue(all(list(h.counts) == sorted(h.counts, reverse=True) for h in exact))

    def test_mix_and_errors(self):
        neural = top_k_logprobs([11, 12, 13], [-1.0, -2.0, -3.0])
        mixed = self.sidecar.mix(self.ids, top_k_logprobs=neural, rule=0.25, top_k=5)
        self.assertAlmostEqual(getattr(mixed, "lambda"), 0.25)
        self.assertAlmostEqual(sum(t.prob for t in mixed.top) + mixed.rest_mass, 1.0, places=6)
        with self.assertRaises(InvalidArgument) as refused:
            self.sidecar.mix(self.ids, top_k_logprobs=neural, top_k=0)
        self.assertIn("top_k", refused.exception.details)
        with self.assertRaises(NotFound):
            self.sidecar.draft(session_id=12345)
        with self.assertRaises(ValueError):
            lambda_rule("sometimes")

    def test_session_steps(self):
        with self.sidecar.session() as session:
            state = session.start(self.ids[:10])
            self.assertEqual(state.length, 10)
            self.assertEqual(session.append(self.ids[10:12]).length, 12)
            self.assertEqual(session.truncate(11).length, 11)
            draft = session.draft()
            self.assertEqual(draft, self.sidecar.draft(session_id=session.session_id))
            with self.assertRaises(InvalidArgument):
                session.truncate(99)
            self.assertEqual(session.append([]).length, 11)

    def test_batch_answers_as_sessions_do(self):
        """Three sequences in one Batch stream, each step against its own Session."""
        contexts = [self.ids[:8], self.ids[5:14], self.ids[10:20]]
        sessions = [self.sidecar.session() for _ in contexts]
        for s, c in zip(sessions, contexts):
            s.start(c)
        neural = top_k_logprobs([11, 12, 13], [-1.0, -2.0, -3.0])
        with self.sidecar.batch() as batch:
            mix = batch.mix_request(top_k_logprobs=neural, rule="split", top_k=4)
            results = batch.step([batch.part(i, start=c, mix=mix, draft=draft_options())
                                  for i, c in enumerate(contexts)])
            for step in range(4):
                for r, s in zip(results, sessions):
                    self.assertEqual(r.mix, s.mix(top_k_logprobs=neural, rule="split", top_k=4))
                    self.assertEqual(r.draft, s.draft())
                token = self.ids[20 + step]
                for s in sessions:
                    s.append([token])
                results = batch.step([batch.part(i, append=[token], mix=mix, draft=draft_options())
                                      for i in range(len(contexts))])
            with self.assertRaises(BatchStepError) as refused:
                batch.step([batch.part(7, append=[1])])
            self.assertIsInstance(refused.exception.errors[0], NotFound)
            self.assertIn("sequence 7", str(refused.exception))
        for s in sessions:
            s.close()

    def test_batch_step_with_a_refused_part(self):
        """The sidecar does a step's other parts when one is refused: the error carries every result,
        so the caller sees what was done and goes on from there without sending it again."""
        with self.sidecar.batch() as batch:
            batch.step([batch.part(1, start=self.ids[:3]), batch.part(2, start=self.ids[:2])])
            with self.assertRaises(BatchStepError) as refused:
                batch.step([batch.part(1, append=self.ids[3:4]), batch.part(2, keep=99)])
            done, bad = refused.exception.results
            self.assertEqual(refused.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIsNone(refused.exception.errors[0])
            self.assertIsInstance(refused.exception.errors[1], InvalidArgument)
            self.assertEqual((done.state.length, bad.state.length), (4, 2))
            self.assertTrue(bad.HasField("error") and not done.HasField("error"))
            # Sequence 1 holds ids[:4] once: its next step drafts as the unary Draft of ids[:5] does.
            (after,) = batch.step([batch.part(1, append=self.ids[4:5], draft=draft_options())])
            self.assertEqual(after.state.length, 5)
            self.assertEqual(after.draft, self.sidecar.draft(context=self.ids[:5]))
            # Unchecked, a refused part is answered the same, and nothing raises.
            results = batch.step([batch.part(1, append=self.ids[5:6]), batch.part(2, keep=99)],
                                 check=False)
            self.assertEqual([r.state.length for r in results], [6, 2])
            self.assertEqual([r.HasField("error") for r in results], [False, True])

    def test_add_documents_retried_with_its_request_id_is_added_once(self):
        """A request sent again with its request_id (its answer lost, say) adds nothing the second
        time, and says so; the live index holds its tokens once."""
        before = self.sidecar.info().live.tokens
        docs = [self.ids[:10], self.ids[10:20]]
        first = self.sidecar.add_documents("py-retry", docs, request_id="py-1")
        again = self.sidecar.add_documents("py-retry", docs, request_id="py-1")
        self.assertEqual((first.repeated, again.repeated), (False, True))
        self.assertEqual((again.documents, again.tokens), (2, 20))
        self.assertEqual(self.sidecar.info().live.tokens, before + 20)


class StalledSidecar(pb_grpc.SidecarServicer):
    """A sidecar that has stalled: it takes calls and stream messages but never answers. `ended` is
    set when a stream's client goes away."""

    def __init__(self):
        self.ended = threading.Event()

    def Count(self, request, context):
        while context.is_active():
            time.sleep(0.05)

    def Session(self, requests, context):
        try:
            for _ in requests:
                pass
        finally:
            self.ended.set()
        yield from ()

    Batch = Session


class StreamTimeoutTest(unittest.TestCase):
    """A stream step honours the client's timeout as a unary call does, and cancels its stream."""

    TIMEOUT = 1.0

    def setUp(self):
        self.stalled = StalledSidecar()
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_SidecarServicer_to_server(self.stalled, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.sidecar = Sidecar(f"127.0.0.1:{port}", timeout=self.TIMEOUT)
        self.pool = ThreadPoolExecutor(max_workers=1)

    def tearDown(self):
        self.sidecar.close()
        self.server.stop(0)
        self.pool.shutdown()

    def raised(self, call):
        """What `call` raised and after how long; run on a thread so a hang fails instead of blocking."""
        started = time.monotonic()
        error = self.pool.submit(call).exception(timeout=self.TIMEOUT + 5)
        return error, time.monotonic() - started

    def check_step_times_out(self, stream, first, then):
        unary, _ = self.raised(lambda: self.sidecar.count([1, 2]))
        error, waited = self.raised(first)
        self.assertIs(type(error), type(unary))
        self.assertIsInstance(error, DeadlineExceeded)
        self.assertLess(waited, self.TIMEOUT + 1)
        self.assertTrue(self.stalled.ended.wait(5), "the stream was not cancelled")
        # Its state unknown, the stream takes no more steps.
        error, waited = self.raised(then)
        self.assertIsInstance(error, DeadlineExceeded)
        self.assertLess(waited, 0.5)
        stream.close()

    def test_session_step(self):
        session = self.sidecar.session()
        self.check_step_times_out(session, lambda: session.start([1, 2, 3]),
                                  lambda: session.append([4]))

    def test_batch_step(self):
        batch = self.sidecar.batch()
        self.check_step_times_out(batch, lambda: batch.step([batch.part(1, start=[1, 2, 3])]),
                                  lambda: batch.step([batch.part(1, append=[4])]))


class LmEvalAdapterTest(unittest.TestCase):
    """`SidecarLM` against the Score RPC it is built on, and its greedy generation against a
    session's own-model mixes."""

    @classmethod
    def setUpClass(cls):
        from infini_sidecar.lm_eval import SidecarLM
        cls.lm = SidecarLM(addr=ADDR, mode="neural")
        cls.sidecar = Sidecar(ADDR)

    def request(self, *args):
        class Instance:
            pass
        r = Instance()
        r.args = args
        return r

    def test_rolling_is_score_of_the_document(self):
        ids = self.sidecar.tokenize(TEXT)
        (doc,) = [i.document for i in self.sidecar.score([ids], rule=0.0) if i.HasField("document")]
        (got,) = self.lm.loglikelihood_rolling([self.request(TEXT)])
        self.assertAlmostEqual(got, -doc.neural_nll, places=4)

    def test_loglikelihood_and_greedy(self):
        context, continuation = TEXT[:40], TEXT[40:60]
        ((logprob, greedy),) = self.lm.loglikelihood([self.request(context, continuation)])
        ctx, cont = self.sidecar.tokenize(context), self.sidecar.tokenize(continuation)
        scores = [i.document for i in self.sidecar.score([ctx + cont], per_token=True, rule=0.0)
                  if i.HasField("document")][0].token_scores
        self.assertAlmostEqual(logprob, sum(s.neural_logprob for s in scores[-len(cont):]), places=4)
        # Greedy means every continuation token was the own model's top token.
        with self.sidecar.session() as s:
            s.start(ctx, use_model=True)
            want = True
            for t in cont:
                top = s.mix(own_model=True, rule=0.0, top_k=1).top[0].token
                want = want and top == t
                s.append([t])
        self.assertEqual(greedy, want)

    def test_generate_until_is_greedy_decoding(self):
        (text,) = self.lm.generate_until([self.request(TEXT[:60], {"until": ["\n\n"], "max_gen_toks": 12})])
        ids = self.sidecar.tokenize(TEXT[:60])
        out = []
        with self.sidecar.session() as s:
            s.start(ids, use_model=True)
            for _ in range(12):
                token = s.mix(own_model=True, rule=0.0, top_k=1).top[0].token
                out.append(token)
                s.append([token])
        want = self.sidecar.detokenize(out)
        want = want[: want.index("\n\n")] if "\n\n" in want else want
        self.assertEqual(text, want)
        self.assertTrue(math.isfinite(len(text)))


if __name__ == "__main__":
    unittest.main()
