"""The report-channel messages (``trainer/proto/nestor.proto``), built from a
descriptor at import time so the client needs no generated code and no
protoc, and works with any protobuf runtime from 4.25 on."""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto

REPORT_METHOD = "/nestor.v1.Reporter/Report"
PUT_SHARD_METHOD = "/nestor.v1.Reporter/PutShard"
GET_SHARD_METHOD = "/nestor.v1.Reporter/GetShard"
RENDEZVOUS_METHOD = "/nestor.v1.Reporter/Rendezvous"
GET_FILE_METHOD = "/nestor.v1.Reporter/GetFile"
BOOK_METHOD = "/nestor.v1.Reporter/Book"
RUN_TRAINER_METHOD = "/nestor.v1.Reporter/RunTrainer"
PROTOCOL_VERSION = 1


def _field(msg, name, number, type_, label=_F.LABEL_OPTIONAL, type_name=None):
    f = msg.field.add(name=name, number=number, type=type_, label=label)
    if type_name:
        f.type_name = type_name
    return f


def _map(msg, name, number, owner):
    """A ``map<string, double>`` field of message ``owner``."""
    entry_name = "".join(part.capitalize() for part in name.split("_")) + "Entry"
    entry = msg.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_DOUBLE)
    _field(msg, name, number, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, f".nestor.v1.{owner}.{entry_name}")


def _sender(fdp, name):
    """A message that opens with its sender (version, trial, token, rank), as ``ReportRequest`` does."""
    msg = fdp.message_type.add(name=name)
    _field(msg, "version", 1, _F.TYPE_UINT32)
    _field(msg, "trial_id", 2, _F.TYPE_STRING)
    _field(msg, "token", 3, _F.TYPE_STRING)
    _field(msg, "rank", 4, _F.TYPE_UINT32)
    return msg


def _file():
    fdp = descriptor_pb2.FileDescriptorProto(name="nestor/v1/nestor.proto", package="nestor.v1", syntax="proto3")
    req = fdp.message_type.add(name="ReportRequest")
    _field(req, "version", 1, _F.TYPE_UINT32)
    _field(req, "trial_id", 2, _F.TYPE_STRING)
    _field(req, "token", 3, _F.TYPE_STRING)
    _field(req, "rank", 4, _F.TYPE_UINT32)
    entry = req.nested_type.add(name="MetricsEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_DOUBLE)
    _field(req, "metrics", 5, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".nestor.v1.ReportRequest.MetricsEntry")
    # The step's checkpoint, one of: in place, shipped, uploaded by the rank, staged.
    req.oneof_decl.add(name="checkpoint")
    for name, number in (("checkpoint_dir", 6), ("checkpoint_upload", 7), ("checkpoint_uploaded", 9), ("checkpoint_staged_dir", 11)):
        _field(req, name, number, _F.TYPE_STRING).oneof_index = 0
    # Senders from before the oneof: checkpoint_dir with this set was a staged copy.
    _field(req, "checkpoint_staged", 8, _F.TYPE_BOOL)
    _field(req, "extra", 10, _F.TYPE_STRING)
    enum = fdp.enum_type.add(name="Directive")
    for i, name in enumerate(["DIRECTIVE_UNSPECIFIED", "DIRECTIVE_CONTINUE", "DIRECTIVE_STOP"]):
        enum.value.add(name=name, number=i)
    reply = fdp.message_type.add(name="ReportReply")
    _field(reply, "directive", 1, _F.TYPE_ENUM, type_name=".nestor.v1.Directive")
    _field(reply, "training_iteration", 2, _F.TYPE_UINT64)
    _field(reply, "acknowledged_iteration", 3, _F.TYPE_UINT64)
    # Messages that open with the sender, as ReportRequest does.
    chunk = _sender(fdp, "ShardChunk")
    shard_request = _sender(fdp, "ShardRequest")
    meet = _sender(fdp, "RendezvousRequest")
    _field(chunk, "path", 5, _F.TYPE_STRING)
    _field(shard_request, "path", 5, _F.TYPE_STRING)
    _field(shard_request, "whole", 6, _F.TYPE_BOOL)
    _field(chunk, "data", 6, _F.TYPE_BYTES)
    _field(meet, "address", 5, _F.TYPE_STRING)
    met = fdp.message_type.add(name="RendezvousReply")
    _field(met, "address", 1, _F.TYPE_STRING)
    book = _sender(fdp, "BookRequest")
    _field(book, "num_workers", 5, _F.TYPE_UINT32)
    _field(book, "use_gpu", 6, _F.TYPE_BOOL)
    _map(book, "resources_per_worker", 7, "BookRequest")
    _map(book, "trainer_resources", 8, "BookRequest")
    _field(book, "placement_strategy", 9, _F.TYPE_STRING)
    granted = fdp.message_type.add(name="GrantedBundle")
    _field(granted, "cpus", 1, _F.TYPE_DOUBLE)
    _field(granted, "gpus", 2, _F.TYPE_UINT32, _F.LABEL_REPEATED)
    _field(granted, "gpu_share", 3, _F.TYPE_DOUBLE)
    _field(granted, "memory_bytes", 4, _F.TYPE_DOUBLE)
    _map(granted, "custom", 5, "GrantedBundle")
    booked = fdp.message_type.add(name="BookReply")
    _field(booked, "workers", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".nestor.v1.GrantedBundle")
    trainer = _sender(fdp, "TrainerRequest")
    _field(trainer, "run", 5, _F.TYPE_STRING)
    update = fdp.message_type.add(name="TrainerUpdate")
    _field(update, "update", 1, _F.TYPE_STRING)
    receipt = fdp.message_type.add(name="ShardReceipt")
    _field(receipt, "upload", 1, _F.TYPE_STRING)
    _field(receipt, "files", 2, _F.TYPE_UINT32)
    _field(receipt, "bytes", 3, _F.TYPE_UINT64)
    return fdp


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())


def _message(name):
    desc = _pool.FindMessageTypeByName(name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(_pool).GetPrototype(desc)  # protobuf < 4.22


ReportRequest = _message("nestor.v1.ReportRequest")
ReportReply = _message("nestor.v1.ReportReply")
ShardChunk = _message("nestor.v1.ShardChunk")
ShardRequest = _message("nestor.v1.ShardRequest")
ShardReceipt = _message("nestor.v1.ShardReceipt")
RendezvousRequest = _message("nestor.v1.RendezvousRequest")
RendezvousReply = _message("nestor.v1.RendezvousReply")
BookRequest = _message("nestor.v1.BookRequest")
BookReply = _message("nestor.v1.BookReply")
TrainerRequest = _message("nestor.v1.TrainerRequest")
TrainerUpdate = _message("nestor.v1.TrainerUpdate")
#: File bytes in one shard chunk (the Rust client's size).
CHUNK_BYTES = 256 << 10
DIRECTIVE_CONTINUE = 1
DIRECTIVE_STOP = 2
