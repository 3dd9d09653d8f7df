"""Malformed RPCs sent straight to a shard over its socket, as no router would send them: each
gets a gRPC error naming the problem, and the shard keeps serving the batches it holds."""

import asyncio

import grpc
import pytest

from shard.server import TextGenerationService
from switchyard_pb import generate_pb2 as pb
from switchyard_pb import generate_pb2_grpc as pb_grpc
from tests.shard.servicer_helpers import BLOCK_SIZE, BlockPool, start_service

KV_TOKENS = 1024  # 64 blocks of 16
NUM_BLOCKS = KV_TOKENS // BLOCK_SIZE
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def service(servicer_model_dir) -> TextGenerationService:
    return start_service(servicer_model_dir)


def one(request: pb.Request, batch_id: int = 50) -> pb.PrefillRequest:
    return pb.PrefillRequest(batch=pb.Batch(id=batch_id, requests=[request], size=1))


def malformed(pool: BlockPool, vocab: int) -> list[tuple[str, str, object, str]]:
    """(case, method, request, what the error must say)."""
    good = pool.request(100, [5, 6, 7], 4)

    def variant(**changes) -> pb.Request:
        r = pb.Request()
        r.CopyFrom(good)
        for name, value in changes.items():
            if isinstance(value, list):
                r.ClearField(name)
                getattr(r, name).extend(value)
            elif name == "temperature":
                r.parameters.temperature = value
            else:
                setattr(r, name, value)
        return r

    far_block = [NUM_BLOCKS + 3]
    return [
        ("unknown batch", "Decode", pb.DecodeRequest(batches=[pb.CachedBatch(id=777)]), "777"),
        ("no batches", "Decode", pb.DecodeRequest(), "at least one"),
        ("same batch twice", "Decode",
         pb.DecodeRequest(batches=[pb.CachedBatch(id=1), pb.CachedBatch(id=1)]), "twice"),
        ("empty prefill", "Prefill", pb.PrefillRequest(batch=pb.Batch(id=51)), "needs new"),
        ("token past the vocabulary", "Prefill", one(variant(input_ids=[5, vocab + 7])),
         "vocabulary"),
        ("empty prompt", "Prefill", one(variant(input_ids=[])), "empty prompt"),
        ("block past the cache", "Prefill",
         one(variant(blocks=far_block,
                     slots=[far_block[0] * BLOCK_SIZE + i for i in range(7)])), "past the cache"),
        ("slots outside its blocks", "Prefill", one(variant(slots=[0, 1, 2, 3, 4, 5, 6])),
         "outside its own blocks"),
        ("prefill past its slots", "Prefill", one(variant(input_ids=list(range(3, 30)))),
         "KV slots for 27 prompt tokens"),
        ("more positions than blocks hold", "Prefill",
         one(variant(slots=[good.blocks[0] * BLOCK_SIZE] * (BLOCK_SIZE + 1))), "do not fit"),
        ("request id already live", "Prefill", one(variant(id=1)), "already on this shard"),
        ("request twice in one batch", "Prefill",
         pb.PrefillRequest(batch=pb.Batch(id=52, requests=[good, good], size=2)), "twice"),
        ("batch id already cached", "Prefill", one(good, batch_id=1), "already cached"),
        ("NaN temperature", "Prefill", one(variant(temperature=float("nan"))), "temperature"),
        ("top_n past the vocabulary", "Prefill", one(variant(top_n_tokens=vocab + 1)),
         "top_n_tokens"),
        ("filter an unknown batch", "FilterBatch",
         pb.FilterBatchRequest(batch_id=778, request_ids=[1]), "778"),
        ("filter to unknown requests", "FilterBatch",
         pb.FilterBatchRequest(batch_id=1, request_ids=[99]), "no requests [99]"),
        ("filter to nothing", "FilterBatch", pb.FilterBatchRequest(batch_id=1), "ClearCache"),
        ("filter naming a request twice", "FilterBatch",
         pb.FilterBatchRequest(batch_id=1, request_ids=[1, 1]), "twice"),
    ]  # fmt: skip


def test_malformed_rpcs_are_refused_and_the_shard_keeps_serving(service, tmp_path):
    vocab = service.runner.model.vocab_size

    async def scenario() -> None:
        server = grpc.aio.server()
        pb_grpc.add_TextGenerationServiceServicer_to_server(service, server)
        socket = f"unix://{tmp_path}/shard-0"
        server.add_insecure_port(socket)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(socket) as channel:
                await exchange(pb_grpc.TextGenerationServiceStub(channel))
        finally:
            await server.stop(None)

    async def exchange(stub) -> None:
        await stub.Warmup(pb.WarmupRequest(max_batch_total_tokens=KV_TOKENS))
        pool = BlockPool(NUM_BLOCKS)
        live = await stub.Prefill(one(pool.request(1, [3, 4, 5, 6], 8), batch_id=1))
        assert list(live.batch.request_ids) == [1]
        for case, method, request, says in malformed(pool, vocab):
            try:
                await getattr(stub, method)(request)
            except grpc.aio.AioRpcError as refused:
                assert refused.code() == INVALID, case
                assert says in refused.details(), (case, refused.details())
            else:
                pytest.fail(f"{case}: accepted")
        # Still serving: the live batch decodes, and a new request joins it.
        step = await stub.Decode(pb.DecodeRequest(batches=[live.batch]))
        assert [g.request_id for g in step.generations] == [1]
        joined = await stub.Prefill(
            pb.PrefillRequest(
                batch=pb.Batch(id=2, requests=[pool.request(2, [7, 8, 9], 4)], size=1),
                cached_batches=[step.batch],
            )
        )
        assert sorted(g.request_id for g in joined.generations) == [1, 2]
        await stub.Health(pb.HealthRequest())

    asyncio.run(scenario())
