// Package pytorch imports what PyTorch users already record, a PyTorch
// Execution Trace (ExecutionTraceObserver JSON, schema 1.0.x to 1.1.x) and the
// Kineto profile (Chrome trace) of the same window, into the chameleon data
// model: a *trace.Trace with one iteration.
//
// # Recording
//
// Record one training step with both observers active; the Execution Trace
// gives the operator tree and tensor identities, Kineto the timings and the
// allocator's [memory] events:
//
//	import torch
//	from torch.profiler import (ExecutionTraceObserver, ProfilerActivity,
//	                            profile, schedule)
//
//	et = ExecutionTraceObserver()
//	et.register_callback("step.et.json")
//
//	def write_kineto(prof):
//	    prof.export_chrome_trace("step.kineto.json")
//
//	with profile(
//	    activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
//	    schedule=schedule(wait=1, warmup=1, active=1, repeat=1),
//	    record_shapes=True,   # tensor shapes
//	    profile_memory=True,  # "[memory]" events: the allocated-bytes curve
//	    with_stack=False,     # optional
//	    execution_trace_observer=et,  # ET of the same (active) step
//	    on_trace_ready=write_kineto,
//	) as prof:
//	    for step, batch in zip(range(3), loader):
//	        loss = model(**batch).loss
//	        loss.backward()
//	        optimizer.step()
//	        optimizer.zero_grad(set_to_none=True)
//	        prof.step()
//
// then, in Go:
//
//	tr, err := pytorch.Import("step.et.json", "step.kineto.json")
//
// Either file may be gzip-compressed (told by its first bytes). Only one
// profiled step should be in the window: the importer makes one iteration of
// all it finds.
//
// # What becomes what
//
// Ops are the top-level aten operators: the aten ops with no aten ancestor
// on their Execution Trace parent (ctrl_deps) chain, in node-id order (the
// order they started; ET writes nodes in post-order). That is the level
// users call: composite operators such as aten::linear, aten::to or
// aten::scaled_dot_product_attention appear as one op and their
// decomposition (aten::t, aten::mm, aten::_to_copy, ...) is inside it. In
// backward, the ops the autograd functions call (the children of
// "MmBackward0" under "autograd::engine::evaluate_function: MmBackward0")
// are top level; their Module is "#MmBackward0".
//
// Timing joins the ET rf_id of each op to the Kineto cpu_op whose
// args["Record function id"] is the same; kernels, copies and memsets join
// to the cpu_op that launched them through args["External id"] (or the
// launch's correlation id), and count for the top-level op above it. DurUS
// is the device time of what the op launched when it launched anything, else
// its host (cpu_op) duration: device time is what the op costs on the
// accelerator's timeline, while host durations under the profiler are
// inflated by its own bookkeeping; view and metadata ops launch nothing and
// keep their (small) host time. Both are kept in Result.Ops.
//
// Mem is the device's "Total Allocated" after the op: the last [memory]
// event at or before the op's end on the host clock. PeakBytes is the
// highest "Total Allocated" within the window, TimeMS the ProfilerStep#N
// duration or else the span of the ops (host start of the first to the end
// of the last host or device event they caused).
//
// # Phases
//
// In order: an op under an "Optimizer.*" record function (torch.optim's
// "Optimizer.step#AdamW.step", "Optimizer.zero_grad#AdamW.zero_grad") is
// opt; an op under an "autograd::engine::evaluate_function: ..." node, or on
// a thread other than the main one (the first op's) that hosts such nodes
// (the device's autograd thread), is bwd; main-thread ops after the last bwd
// op are opt (gradient clipping, grad-scaler unscaling); main-thread ops
// autograd did not record (seq_id -1) between the last recorded forward op
// and the first bwd op are bwd (the aten::ones_like grad seed of
// loss.backward()); the rest is fwd.
//
// # Storages and kinds
//
// ET names a storage by its data address, and a freed address comes back
// under the same storage id, so lifetimes are split at allocations: a
// top-level op allocates a storage that is among its outputs and not among
// its inputs (in-place ops, "_" suffix, and out= variants write a storage
// they were handed, which is among their inputs; resize_ moving the data
// gets a new id). A storage a descendant allocates that the op does not
// return (the log_softmax result inside cross_entropy_loss, attention's
// logsumexp and RNG state, all saved for backward) becomes an output of the
// op when a later op reads it; one never read again was a temporary and is
// left out. Each allocation is a fresh trace.TensorID. Storage size is the
// largest extent any view of it reaches, (offset+1+Σ(size-1)·stride)·itemsize
// ((offset+numel)·itemsize for dense views; broadcast views count once).
// CPU tensors, undefined tensors and empty storages are left out; Ptr is 0.
//
// A produced tensor is an activation, unless a factory op (zeros_like,
// zeros, empty, ...) made it in the optimizer phase and its storage id is
// not reallocated later in the window (state created by a first step). A
// tensor used but never produced in the window existed before it: optimizer
// state when its first use is in the optimizer phase (exp_avg, exp_avg_sq,
// step), a parameter when the optimizer reads it or it is at least
// WithParamMinBytes large (frozen weights, big buffers), else an input.
//
// # Views that copy
//
// Whether an op aliased its input is read from the storage ids, not from
// its name: a view (view, transpose, a reshape the strides allow) returns
// its input's storage, so its output is its input's tensor. An op that
// returns a storage it was not handed allocated and wrote it: aten::reshape
// and view_as of strides that allow no view copy through clone. Where the
// name of such an op reads as a view to the data model's consumers
// (layer.Classify, which the replay's byte check and mre follow), it is
// named after the node inside it that allocated the storage (aten::clone),
// with that node's overload, so that none of them takes it for a view that
// writes nothing; OpInfo.ETName keeps the Execution Trace's name.
//
// # Limits
//
// Both files are read one node or event at a time, and the importer bounds
// what a file may cost so that a damaged or hostile one (a 1 MB gzip can
// inflate to a gigabyte string) is refused with a ParseError naming the
// file, the node or event and the field, once a limit is read: each file is
// at most MaxInputBytes (1 GiB) decompressed; each node, event or other
// value read at once at most MaxValueBytes (8 MiB, white space runs cut to
// one byte); each list inside a node at most MaxListLen (65,536) elements;
// an Execution Trace at most MaxNodes (1,048,576) nodes with MaxTensorArgs
// (2,097,152) device-tensor arguments in all; a Kineto profile at most
// MaxEvents (1,048,576) events; and the distinct strings kept of a file
// (names, op schemas, dtypes, devices, each kept once) at most MaxStrings
// (65,536) of MaxStringBytes (8 MiB) in all. The bundled Llama step has a
// 2.9 MB Execution Trace of 2,829 nodes (the largest 14,360 bytes, lists of
// at most 39 elements) and a 2.3 MB profile of 6,960 events.
//
// Values that parse but make nonsense are refused too: parent links
// (ctrl_deps, or parent in schema 1.0.1) that form a cycle, the error
// naming its nodes (a node that is its own parent is a root, as the
// process node of every trace is); a Kineto event whose dur is negative or
// over MaxEventUS (a day) or whose ts is more than MaxTimestampUS (2^53
// µs) from zero; an op whose time is over trace.MaxOpUS (an hour); a
// profiled step that spans more than trace.MaxIterMS (a day).
package pytorch
