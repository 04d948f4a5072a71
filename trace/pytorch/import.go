package pytorch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/chameleon-go/chameleon/trace"
)

// Format is the Header.Format of an imported trace.
const Format = "pytorch-et+kineto"

// DefaultParamMinBytes is the size from which a tensor that exists before the
// window and is not updated by the optimizer counts as a parameter (frozen
// weights, buffers) rather than an input.
const DefaultParamMinBytes = 1 << 20

// Option configures an import.
type Option func(*config)

type config struct {
	paramMinBytes int64
}

// WithParamMinBytes sets the size from which a pre-existing tensor that the
// optimizer does not update is classified trace.KindParam instead of
// trace.KindInput (default DefaultParamMinBytes).
func WithParamMinBytes(n int64) Option { return func(c *config) { c.paramMinBytes = n } }

// Result is an imported trace with what the two files said about each op
// beyond the data model.
type Result struct {
	Trace *trace.Trace
	// Ops parallels Trace.Iterations[0].Ops.
	Ops    []OpInfo
	Schema string // the Execution Trace schema
	// MatchedOps counts the top-level ops that have a Kineto record.
	MatchedOps int
	// KernelUS is the device time of every kernel, copy and memset in the
	// profile; UnattributedKernelUS the part launched outside any top-level
	// aten op of the Execution Trace.
	KernelUS, UnattributedKernelUS float64
	// SpanMS is the profiled step's span (the window's host and device
	// time). When the window's kernels take under HostBoundShare of it, the
	// step was host-bound under the profiler: the iteration's TimeMS is
	// then the kernel timeline (the sum of its ops' kernel times), what a
	// GPU-bound step runs in without the profiler's host overhead, WallMS
	// keeps the span, and Warnings says so.
	SpanMS   float64
	Warnings []string
}

// HostBoundShare is the share of the profiled span below which the
// window's kernels mark the step as host-bound under the profiler.
const HostBoundShare = 0.5

// OpInfo is the provenance and both timings of one imported op.
type OpInfo struct {
	NodeID int64 // Execution Trace node id
	RFID   int64 // record-function id (Kineto "Record function id")
	Tid    int64 // Execution Trace thread id
	// ETName is the Execution Trace node's name. The op's Name is the same
	// except for an op named as a view that copied into a new storage (an
	// aten::reshape of non-contiguous strides): that op is named after the
	// node inside it that allocated the copy (aten::clone), see the package
	// documentation's "Views that copy".
	ETName string
	// AutogradNode is the backward function that ran the op
	// ("MmBackward0"), empty outside backward.
	AutogradNode string
	Matched      bool    // a Kineto cpu_op carries the op's rf_id
	CPUStartUS   float64 // Kineto clock, µs
	CPUDurUS     float64 // host time of the op (cpu_op dur)
	KernelUS     float64 // device time of what the op launched
	Kernels      int     // number of kernels, copies and memsets it launched
}

// Import reads a PyTorch Execution Trace (ExecutionTraceObserver JSON) and the
// Kineto profile (Chrome trace) of the same window, each gzip-compressed or
// plain, into a trace with one iteration.
func Import(etPath, kinetoPath string, opts ...Option) (*trace.Trace, error) {
	res, err := LoadFiles(etPath, kinetoPath, opts...)
	if err != nil {
		return nil, err
	}
	return res.Trace, nil
}

// ImportReaders is Import over streams; the names are used in errors.
func ImportReaders(et io.Reader, etName string, kineto io.Reader, kinetoName string, opts ...Option) (*trace.Trace, error) {
	res, err := Load(et, etName, kineto, kinetoName, opts...)
	if err != nil {
		return nil, err
	}
	return res.Trace, nil
}

// LoadFiles is Import returning the per-op details too.
func LoadFiles(etPath, kinetoPath string, opts ...Option) (*Result, error) {
	ef, err := os.Open(etPath)
	if err != nil {
		return nil, err
	}
	defer ef.Close()
	kf, err := os.Open(kinetoPath)
	if err != nil {
		return nil, err
	}
	defer kf.Close()
	return Load(ef, filepath.Base(etPath), kf, filepath.Base(kinetoPath), opts...)
}

// Load is ImportReaders returning the per-op details too.
func Load(et io.Reader, etName string, kineto io.Reader, kinetoName string, opts ...Option) (*Result, error) {
	cfg := config{paramMinBytes: DefaultParamMinBytes}
	for _, o := range opts {
		o(&cfg)
	}
	er, eclose, err := decompress(et, etName)
	if err != nil {
		return nil, err
	}
	doc, err := readET(er, etName)
	if cerr := eclose(); err == nil && cerr != nil {
		err = readErr(etName, "", cerr)
	}
	if err != nil {
		return nil, err
	}
	kr, kclose, err := decompress(kineto, kinetoName)
	if err != nil {
		return nil, err
	}
	kd, err := readKineto(kr, kinetoName)
	if cerr := kclose(); err == nil && cerr != nil {
		err = readErr(kinetoName, "", cerr)
	}
	if err != nil {
		return nil, err
	}
	b := &builder{cfg: cfg, doc: doc, kd: kd, etName: etName, kName: kinetoName}
	return b.build()
}

// nodeInfo is what a node inherits from its ancestors.
type nodeInfo struct {
	top      int    // index of the outermost aten op on the path from the root, -1 when none
	autograd string // the backward function of the nearest evaluate_function ancestor
	inEval   bool
	opt      bool // under an Optimizer.* record function
}

type builder struct {
	cfg           config
	doc           *etDoc
	kd            *kinetoDoc
	etName, kName string

	info []nodeInfo
	tops []int // node indices of the top-level aten ops, by id
}

const evalPrefix = "autograd::engine::evaluate_function"

func isAten(name string) bool { return strings.HasPrefix(name, "aten::") }

func (b *builder) build() (*Result, error) {
	nodes := b.doc.nodes
	if err := b.walk(); err != nil {
		return nil, err
	}
	if len(b.tops) == 0 {
		return nil, &ParseError{File: b.etName, Field: "nodes", Err: errors.New("no aten operators in the execution trace")}
	}
	res := &Result{Schema: b.doc.schema, Ops: make([]OpInfo, len(b.tops))}
	for k, i := range b.tops {
		n := nodes[i]
		res.Ops[k] = OpInfo{NodeID: n.id, RFID: n.rf, Tid: n.tid, ETName: n.name, AutogradNode: b.info[i].autograd}
	}
	phases := b.phases()
	if err := b.join(res); err != nil {
		return nil, err
	}

	it := &trace.Iteration{Index: 0, Tensors: make(map[trace.TensorID]*trace.Tensor)}
	it.Ops = make([]trace.Op, len(b.tops))
	for k, i := range b.tops {
		n := nodes[i]
		op := trace.Op{
			Seq: k, Name: n.name, Overload: overload(n.name, n.schema), Phase: phases[k], Mem: -1,
		}
		if op.Phase == trace.PhaseBackward && res.Ops[k].AutogradNode != "" {
			op.Module = "#" + res.Ops[k].AutogradNode
		}
		oi := res.Ops[k]
		what := "the kernels, copies and memsets it launched take"
		if oi.Kernels > 0 {
			op.DurUS = oi.KernelUS
		} else {
			op.DurUS, what = oi.CPUDurUS, "its cpu_op takes"
		}
		if err := checkTime(op.DurUS, trace.MaxOpUS, "an hour"); err != nil {
			return nil, &ParseError{File: b.kName, Where: fmt.Sprintf("node %d (%s)", n.id, clip(n.name)), Field: "dur",
				Err: fmt.Errorf("%s %w", what, err)}
		}
		it.Ops[k] = op
	}
	b.storages(it)
	b.copies(it)
	b.memory(it, res)
	if err := b.window(it, res); err != nil {
		return nil, err
	}
	res.Trace = &trace.Trace{
		Name:       b.etName,
		Header:     trace.Header{Format: Format, Device: b.kd.deviceName},
		Iterations: []*trace.Iteration{it},
	}
	return res, nil
}

// walk computes each node's inherited info from its ctrl_deps parent chain
// and collects the top-level aten ops: the aten ops with no aten ancestor.
func (b *builder) walk() error {
	nodes := b.doc.nodes
	index := make(map[int64]int, len(nodes))
	for i, n := range nodes {
		index[n.id] = i
	}
	b.info = make([]nodeInfo, len(nodes))
	state := make([]uint8, len(nodes)) // 0 new, 1 on the path, 2 done
	var path []int
	for start := range nodes {
		if state[start] == 2 {
			continue
		}
		path = path[:0]
		i := start
		for {
			state[i] = 1
			path = append(path, i)
			n := nodes[i]
			p, ok := index[n.parent]
			if !n.hasParent || !ok || p == i || state[p] == 2 {
				break
			}
			if state[p] == 1 {
				return b.cycle(path, p)
			}
			i = p
		}
		for k := len(path) - 1; k >= 0; k-- {
			i := path[k]
			n := nodes[i]
			inf := nodeInfo{top: -1}
			if p, ok := index[n.parent]; n.hasParent && ok && p != i {
				inf = b.info[p]
			}
			if inf.top < 0 && isAten(n.name) {
				inf.top = i
			}
			if strings.HasPrefix(n.name, evalPrefix) {
				inf.inEval = true
				inf.autograd = strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(n.name, evalPrefix), ":"))
			}
			if strings.HasPrefix(n.name, "Optimizer.") {
				inf.opt = true
			}
			b.info[i] = inf
			state[i] = 2
		}
	}
	for i, n := range nodes {
		if isAten(n.name) && b.info[i].top == i {
			b.tops = append(b.tops, i)
		}
	}
	return nil
}

// maxCycleIDs is how many node ids a cycle's error names.
const maxCycleIDs = 16

// cycle is the error of a parent chain that comes back to node p: path
// holds the chain, p among it, each node's parent after it. It names the
// nodes of the cycle in link order from the one with the lowest id, the
// first maxCycleIDs of them.
func (b *builder) cycle(path []int, p int) error {
	nodes := b.doc.nodes
	ring := path[slices.Index(path, p):]
	low := 0
	for k, i := range ring {
		if nodes[i].id < nodes[ring[low]].id {
			low = k
		}
	}
	var ids strings.Builder
	for k := range min(len(ring), maxCycleIDs) {
		fmt.Fprintf(&ids, "%d -> ", nodes[ring[(low+k)%len(ring)]].id)
	}
	if len(ring) > maxCycleIDs {
		ids.WriteString("... -> ")
	}
	fmt.Fprintf(&ids, "%d", nodes[ring[low]].id)
	first := nodes[ring[low]]
	return &ParseError{File: b.etName, Where: fmt.Sprintf("node %d", first.id), Field: first.parentKey,
		Err: fmt.Errorf("parent links form a cycle of %d nodes: %s; a node's parent chain must end at a root (a node that is its own parent, or whose parent is not in the trace)", len(ring), ids.String())}
}

// phases labels the top-level ops.
//
// The rule, in order:
//  1. an op under an "Optimizer.*" record function (torch.optim wraps step
//     and zero_grad in "Optimizer.step#AdamW.step" and the like) is opt;
//  2. an op under an "autograd::engine::evaluate_function: ..." node, or run
//     on a thread other than the main one (the thread of the first op) that
//     hosts such nodes (the device's autograd thread), is bwd;
//  3. main-thread ops after the last bwd op are opt: gradient clipping, grad
//     scaler unscaling and the like run between backward and the step;
//  4. main-thread ops that autograd did not record (seq_id -1) after the last
//     recorded forward op and before the first bwd op are bwd: the grad seed
//     (aten::ones_like) that loss.backward() creates;
//  5. everything else is fwd.
func (b *builder) phases() []trace.Phase {
	nodes := b.doc.nodes
	ph := make([]trace.Phase, len(b.tops))
	mainTid := nodes[b.tops[0]].tid
	bwdTid := make(map[int64]bool)
	for i, n := range nodes {
		if b.info[i].inEval && n.tid != mainTid {
			bwdTid[n.tid] = true
		}
	}
	firstBwd, lastBwd := -1, -1
	for k, i := range b.tops {
		inf := b.info[i]
		switch {
		case inf.opt:
			ph[k] = trace.PhaseOptimizer
		case inf.inEval || bwdTid[nodes[i].tid]:
			ph[k] = trace.PhaseBackward
			if firstBwd < 0 {
				firstBwd = k
			}
			lastBwd = k
		default:
			ph[k] = trace.PhaseForward
		}
	}
	if lastBwd < 0 {
		return ph
	}
	for k := lastBwd + 1; k < len(ph); k++ {
		if ph[k] == trace.PhaseForward {
			ph[k] = trace.PhaseOptimizer
		}
	}
	lastRec := -1
	for k := 0; k < firstBwd; k++ {
		if ph[k] == trace.PhaseForward && nodes[b.tops[k]].seq >= 0 {
			lastRec = k
		}
	}
	if lastRec >= 0 {
		for k := lastRec + 1; k < firstBwd; k++ {
			if ph[k] == trace.PhaseForward && nodes[b.tops[k]].seq < 0 && nodes[b.tops[k]].tid == mainTid {
				ph[k] = trace.PhaseBackward
			}
		}
	}
	return ph
}

// join matches Kineto records to ET nodes by record-function id and sums the
// device time of what each top-level op launched.
func (b *builder) join(res *Result) error {
	nodes := b.doc.nodes
	if !b.kd.rfSeen {
		return &ParseError{File: b.kName, Field: "args.Record function id", Err: fmt.Errorf("%w: no cpu_op carries a record-function id (profile from a PyTorch without ET support?)", ErrMismatched)}
	}
	byRF := make(map[int64]int, len(nodes))
	for i, n := range nodes {
		if !n.hasRF || strings.HasPrefix(n.name, "[pytorch|profiler|execution_trace|") {
			continue
		}
		if _, dup := byRF[n.rf]; !dup {
			byRF[n.rf] = i
		}
	}
	topPos := make(map[int]int, len(b.tops))
	for k, i := range b.tops {
		topPos[i] = k
	}
	byExt := make(map[int64]int)
	matched := 0
	for e, op := range b.kd.ops {
		if op.rf < 0 {
			continue
		}
		i, ok := byRF[op.rf]
		if !ok {
			continue
		}
		if nodes[i].name != op.name {
			return &ParseError{File: b.kName, Where: fmt.Sprintf("cpu_op %d (%q)", e, op.name), Field: "args.Record function id",
				Err: fmt.Errorf("%w: record-function id %d is %q (node %d) in %s", ErrMismatched, op.rf, nodes[i].name, nodes[i].id, b.etName)}
		}
		matched++
		if op.ext >= 0 {
			byExt[op.ext] = i
		}
		if k, ok := topPos[i]; ok {
			oi := &res.Ops[k]
			oi.Matched, oi.CPUStartUS, oi.CPUDurUS = true, op.ts, op.dur
		}
	}
	if matched == 0 {
		return &ParseError{File: b.kName, Field: "args.Record function id", Err: fmt.Errorf("%w: none of its %d record-function ids names a node of %s", ErrMismatched, len(b.kd.ops), b.etName)}
	}
	for _, oi := range res.Ops {
		if oi.Matched {
			res.MatchedOps++
		}
	}
	for _, g := range b.kd.gpu {
		res.KernelUS += g.dur
		ext := g.ext
		if ext < 0 {
			if e, ok := b.kd.corrExt[g.corr]; ok {
				ext = e
			}
		}
		i, ok := byExt[ext]
		if !ok || b.info[i].top < 0 {
			res.UnattributedKernelUS += g.dur
			continue
		}
		oi := &res.Ops[topPos[b.info[i].top]]
		oi.KernelUS += g.dur
		oi.Kernels++
	}
	return nil
}

// Factory ops whose results, when made in the optimizer phase and kept to
// the end of the window, are optimizer state (torch.optim creates state with
// zeros_like / zeros on the first step).
var factoryOps = map[string]bool{
	"aten::zeros": true, "aten::zeros_like": true, "aten::empty": true, "aten::empty_like": true,
	"aten::full": true, "aten::full_like": true, "aten::ones": true, "aten::ones_like": true,
	"aten::new_zeros": true, "aten::new_empty": true, "aten::new_full": true, "aten::scalar_tensor": true,
	"aten::empty_strided": true, "aten::clone": true,
}

// storages turns ET storage ids into tensor ids.
//
// ET names a storage by its data address, and a freed address comes back
// under the same storage id. A top-level op allocates a storage when the
// storage appears among its outputs and not among its inputs: in-place ops
// (name ending in "_") and out= variants write a storage they were handed,
// so it is among their inputs, while a real allocation (and a reallocation by
// resize_, which moves the data to a new address) is not. Each allocation
// starts a fresh trace.TensorID; a storage first seen as an input existed
// before the window. A tensor's size is the largest extent any view of it
// reaches, (offset + 1 + Σ(size-1)·stride)·itemsize, which is
// (offset+numel)·itemsize for dense views and does not overcount broadcast
// (stride 0) views.
//
// Kinds: a produced tensor is an activation, unless it was made in the
// optimizer phase by a factory op (zeros_like, zeros, empty, ...) and its
// storage id is not reallocated later in the window: new optimizer state.
// A tensor that exists before the window is optimizer state when its first
// use is in the optimizer phase (exp_avg, exp_avg_sq, step), a parameter when
// the optimizer reads it (and so updates it) or when it is at least
// ParamMinBytes large (frozen weights, big buffers), and an input otherwise
// (token ids, labels, small buffers).
func (b *builder) storages(it *trace.Iteration) {
	nodes := b.doc.nodes
	type meta struct {
		t           *trace.Tensor
		pre         bool
		firstUse    trace.Phase
		readByOpt   bool
		prodPhase   trace.Phase
		prodFactory bool
		superseded  bool
		prodOp      int
		hidden      bool // allocated inside an op, not (yet) read by a later one
	}
	var all []*meta
	cur := make(map[int64]*meta)
	newTensor := func(r tensorRef) *meta {
		m := &meta{t: &trace.Tensor{ID: trace.TensorID(len(all)), Bytes: r.bytes, DType: r.dtype, Shape: slices.Clone(r.shape)}}
		all = append(all, m)
		it.Tensors[m.t.ID] = m.t
		return m
	}
	grow := func(m *meta, r tensorRef) {
		if r.bytes > m.t.Bytes {
			m.t.Bytes = r.bytes
		}
	}
	// Storages a descendant of a top-level op allocates and the op does not
	// return: saved tensors (log_softmax output inside cross_entropy_loss, the
	// logsumexp and RNG state of attention) and temporaries. They become
	// outputs of the op when a later op reads them; temporaries are dropped.
	inner := make(map[int][]int)
	for j := range nodes {
		if t := b.info[j].top; t >= 0 && t != j && isAten(nodes[j].name) {
			inner[t] = append(inner[t], j)
		}
	}
	for k, i := range b.tops {
		n := nodes[i]
		op := &it.Ops[k]
		inS := make(map[int64]*meta, len(n.in))
		for _, r := range n.in {
			m, ok := cur[r.storage]
			if !ok {
				m = newTensor(r)
				m.pre, m.firstUse = true, op.Phase
				cur[r.storage] = m
			}
			grow(m, r)
			if op.Phase == trace.PhaseOptimizer {
				m.readByOpt = true
			}
			if m.hidden {
				m.hidden = false
				p := &it.Ops[m.prodOp]
				p.Out = append(p.Out, m.t.ID)
			}
			if _, dup := inS[r.storage]; !dup {
				inS[r.storage] = m
				op.In = append(op.In, m.t.ID)
			}
		}
		mutates := strings.HasSuffix(n.name, "_") || op.Overload == "out" || strings.HasSuffix(op.Overload, "_out")
		outS := make(map[int64]bool, len(n.out))
		alloc := func(r tensorRef) *meta {
			if old, live := cur[r.storage]; live {
				old.superseded = true
			}
			m := newTensor(r)
			m.prodPhase, m.prodOp = op.Phase, k
			m.prodFactory = factoryOps[n.name]
			cur[r.storage] = m
			return m
		}
		for _, r := range n.out {
			m, ok := inS[r.storage]
			if !ok {
				if old, live := cur[r.storage]; live && (outS[r.storage] || mutates) {
					m = old
				} else {
					m = alloc(r)
				}
			}
			grow(m, r)
			if !outS[r.storage] {
				outS[r.storage] = true
				op.Out = append(op.Out, m.t.ID)
			}
		}
		hidden := make(map[int64]*meta)
		for _, j := range inner[i] {
			d := nodes[j]
			for _, r := range d.out {
				s := r.storage
				if _, ok := inS[s]; ok || outS[s] {
					continue
				}
				if m, ok := hidden[s]; ok {
					grow(m, r)
					continue
				}
				if slices.ContainsFunc(d.in, func(x tensorRef) bool { return x.storage == s }) {
					continue
				}
				m := alloc(r)
				m.hidden = true
				hidden[s] = m
			}
		}
	}
	for _, m := range all {
		if m.hidden {
			delete(it.Tensors, m.t.ID)
			continue
		}
		switch {
		case !m.pre:
			m.t.Kind = trace.KindActivation
			if m.prodPhase == trace.PhaseOptimizer && m.prodFactory && !m.superseded {
				m.t.Kind = trace.KindOptState
			}
		case m.firstUse == trace.PhaseOptimizer:
			m.t.Kind = trace.KindOptState
		case m.readByOpt || m.t.Bytes >= b.cfg.paramMinBytes:
			m.t.Kind = trace.KindParam
		default:
			m.t.Kind = trace.KindInput
		}
	}
}

// memory sets each op's Mem to the allocated bytes after it: the last
// "Total Allocated" of the device's [memory] events at or before the op's
// end on the host clock. Before the first event the allocated bytes are the
// first event's total less its own allocation. An op without a Kineto record
// keeps the previous op's value. With no [memory] events Mem stays -1.
func (b *builder) memory(it *trace.Iteration, res *Result) {
	mem := deviceMem(b.kd.mem)
	if len(mem) == 0 {
		return
	}
	base := max(mem[0].total-mem[0].bytes, 0)
	prev := base
	for k := range it.Ops {
		oi := res.Ops[k]
		if oi.Matched {
			end := oi.CPUStartUS + oi.CPUDurUS
			j := sort.Search(len(mem), func(j int) bool { return mem[j].ts > end }) - 1
			if j >= 0 {
				prev = mem[j].total
			} else {
				prev = base
			}
		}
		it.Ops[k].Mem = prev
	}
}

// deviceMem keeps the [memory] events of one accelerator: those not of the
// CPU (Device Type 0), of the device id with the most events. Events without
// device fields are all kept.
func deviceMem(all []memEvent) []memEvent {
	count := make(map[[2]int64]int)
	for _, m := range all {
		if m.hasDevice && m.devType != 0 {
			count[[2]int64{m.devType, m.devID}]++
		}
	}
	var best [2]int64
	bestN := 0
	for d, n := range count {
		if n > bestN || (n == bestN && (d[0] < best[0] || d[0] == best[0] && d[1] < best[1])) {
			best, bestN = d, n
		}
	}
	var out []memEvent
	for _, m := range all {
		if !m.hasDevice || (bestN > 0 && m.devType == best[0] && m.devID == best[1]) {
			out = append(out, m)
		}
	}
	return out
}

// window sets the iteration's time and peak. The window is the
// ProfilerStep#N record holding the most top-level ops when the profile has
// one (its host duration is the step time), else the span from the first
// top-level op's start to the end of the last host record or device event
// they caused. TimeMS and WallMS are both that span: the profiled run is the
// only one measured, so it is an upper bound of the uninstrumented time.
// PeakBytes is the highest "Total Allocated" of the device inside the window
// (transient workspaces included), or the highest Mem.
//
// A window longer than trace.MaxIterMS (a day) is an error: events of one
// step that far apart are not a step.
func (b *builder) window(it *trace.Iteration, res *Result) error {
	start, end := 0.0, 0.0
	have := false
	for _, oi := range res.Ops {
		if !oi.Matched {
			continue
		}
		e := oi.CPUStartUS + oi.CPUDurUS
		if !have || oi.CPUStartUS < start {
			start = oi.CPUStartUS
		}
		if !have || e > end {
			end = e
		}
		have = true
	}
	if !have {
		return nil
	}
	// Device work finishes after the host returns: extend to the last event
	// launched by an op of the window.
	gpuEnd := b.gpuEnd()
	if gpuEnd > end {
		end = gpuEnd
	}
	bestN := 0
	for _, s := range b.kd.steps {
		n := 0
		for _, oi := range res.Ops {
			if oi.Matched && oi.CPUStartUS >= s.ts && oi.CPUStartUS <= s.ts+s.dur {
				n++
			}
		}
		if n > bestN {
			bestN, start, end = n, s.ts, s.ts+s.dur
		}
	}
	if span := (end - start) / 1000; span > trace.MaxIterMS {
		return &ParseError{File: b.kName, Field: "ts", Err: fmt.Errorf(
			"the profiled step spans %g ms (from %g to %g µs), more than a day (%d ms): its events are not of one step", span, start, end, trace.MaxIterMS)}
	}
	it.TimeMS = (end - start) / 1000
	it.WallMS = it.TimeMS
	res.SpanMS = it.TimeMS
	var kernelUS float64
	for _, oi := range res.Ops {
		kernelUS += oi.KernelUS
	}
	if kernelUS > 0 && kernelUS/1000 < HostBoundShare*res.SpanMS {
		it.TimeMS = kernelUS / 1000
		res.Warnings = append(res.Warnings, fmt.Sprintf(
			"%s: the profiled step spans %.1f ms but its kernels take %.2f ms (%.0f%%): it was host-bound under the profiler; "+
				"iteration 0 is planned on its kernel timeline (%.2f ms), as the step runs when the GPU is the bottleneck",
			b.kName, res.SpanMS, kernelUS/1000, 100*kernelUS/1000/res.SpanMS, it.TimeMS))
	}
	for _, m := range deviceMem(b.kd.mem) {
		if m.ts >= start && m.ts <= end && m.total > it.PeakBytes {
			it.PeakBytes = m.total
		}
	}
	for _, op := range it.Ops {
		if op.Mem > it.PeakBytes {
			it.PeakBytes = op.Mem
		}
	}
	return nil
}

func (b *builder) gpuEnd() float64 {
	nodes := b.doc.nodes
	inWindow := make(map[int64]bool)
	for i, n := range nodes {
		if b.info[i].top >= 0 && n.hasRF {
			inWindow[n.rf] = true
		}
	}
	exts := make(map[int64]bool)
	for _, op := range b.kd.ops {
		if op.ext >= 0 && op.rf >= 0 && inWindow[op.rf] {
			exts[op.ext] = true
		}
	}
	end := 0.0
	for _, g := range b.kd.gpu {
		ext := g.ext
		if ext < 0 {
			e, ok := b.kd.corrExt[g.corr]
			if !ok {
				continue
			}
			ext = e
		}
		if exts[ext] && g.ts+g.dur > end {
			end = g.ts + g.dur
		}
	}
	return end
}
