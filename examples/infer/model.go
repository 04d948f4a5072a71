package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/examples/internal/backend"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Model is a stack of decoder blocks serving several sessions. A block
// reads one token's hidden state x (1 x Width):
//
//	k   = x Wk                     appended to the block's cache K (a new storage one row longer)
//	a   = tanh(x K^T / sqrt(Width)) attention scores over the cache
//	h   = x + a K / positions       what the cache says about x
//	y   = h + tanh(h W1) W2         the MLP
//
// and the head turns the last block's y into logits (1 x Vocab) with Wout;
// the next token is their argmax, embedded by a row of Emb. Every weight is
// Frozen, set from the host with Engine.Fill.
type Model struct {
	Layers, Width, FFN, Vocab int
	// Sessions take turns, one token each per round; each starts with
	// Prompt positions in its caches.
	Sessions, Prompt int
}

// Validate refuses a model that cannot run.
func (m Model) Validate() error {
	if m.Layers < 1 || m.Width < 1 || m.FFN < 1 || m.Vocab < 2 || m.Sessions < 1 || m.Prompt < 1 {
		return fmt.Errorf("model %+v: layers, width, ffn, sessions and prompt must be at least 1, vocab at least 2", m)
	}
	if m.Width > 1<<15 || m.FFN > 1<<16 || m.Vocab > 1<<20 || m.Layers > 1<<10 || m.Sessions > 1<<10 {
		return fmt.Errorf("model %+v: too large for this example", m)
	}
	return nil
}

// WeightBytes is the bytes of every weight.
func (m Model) WeightBytes() int64 {
	d, f, v := int64(m.Width), int64(m.FFN), int64(m.Vocab)
	return 4 * (int64(m.Layers)*(d*d+2*d*f) + 2*v*d)
}

// CacheBytes is the bytes of every session's caches at positions.
func (m Model) CacheBytes(positions int) int64 {
	return 4 * int64(m.Sessions) * int64(m.Layers) * int64(positions) * int64(m.Width)
}

// UpperBoundBytes bounds what a run of steps rounds holds at once: the
// weights, the caches at their longest (twice, for the old and the new
// storage of one append), one turn's activations, and the allocator's
// rounding of every tensor.
func (m Model) UpperBoundBytes(steps int) int64 {
	pos := m.Prompt + steps
	acts := 4 * int64(4*m.Width+m.FFN+pos+m.Vocab)
	tensors := int64(3*m.Layers+2) + int64(m.Sessions*m.Layers) + 8
	return m.WeightBytes() + m.CacheBytes(pos) + 4*int64(pos*m.Width) + acts + tensors*device.BlockSize + 8<<20
}

// Config is one inference run.
type Config struct {
	Model
	// Steps are the rounds: each session decodes one token per round.
	Steps int
	Seed  uint64
	// Limit is the Engine's device memory limit in bytes.
	Limit int64
	// Hints sends each session's caches off the device after its turn
	// (Engine.Evict) and asks for the next session's ahead of its turn
	// (Engine.Prefetch).
	Hints bool
	// Link is the host link's bandwidth each way in bytes/s the planner
	// models (0: the Engine's default, the measured H200 link).
	Link float64
	// StepMS, when positive, is the round time of the same run with no
	// limit: the planner's op times are fitted to it.
	StepMS float64
	// Estimator prices ops before fitting (nil: layer.Default).
	Estimator layer.Estimator
	// MinSwap is the smallest tensor the planner swaps (0: the Engine's
	// default).
	MinSwap int64
	// SyncPlanning: each step that ends a profile waits for its plan
	// (chameleon.WithSyncPlanning), so that the policy runs from the next
	// step whatever the machine's speed; default: plans run off the step.
	SyncPlanning bool
	// Options are passed to chameleon.New last.
	Options []chameleon.Option
	// Progress, when set, gets each round as it ends.
	Progress func(Round)
}

// Round is what one round (a token of every session) did.
type Round struct {
	Index  int
	Time   time.Duration
	Result chameleon.Result
	// In and Out are the bytes copied to the device and to the host during
	// the round, planned, hinted and forced.
	In, Out int64
	// Released counts the swap-outs that copied nothing (a current host
	// copy), OnDemand the copies back issued at the use.
	Released, OnDemand int64
	Peak               int64
}

// Report is a whole run.
type Report struct {
	Config Config
	Rounds []Round
	Stats  chameleon.Stats
	// Logits are the bytes of every turn's logits, in turn order (round,
	// then session): the run's output.
	Logits []byte
	// Tokens are the tokens decoded, in turn order.
	Tokens []int32
	// Decode is the wall time of the rounds, from the first one's start to
	// the last logits read back.
	Decode time.Duration
	// Sims are the simulated timelines of the policies planned, in order.
	Sims []*simulate.Result
}

// Kernels makes the kernel set for the Engine's compute stream.
type Kernels func(compute device.Stream) (compute.Kernels, error)

// weights are one block's, and the model's ends.
type block struct{ wk, w1, w2 *chameleon.Tensor }

// session is one conversation: its caches (one per block), the token it
// decodes from, and where its last logits land on the host.
type session struct {
	cache  []*chameleon.Tensor
	tok    int32
	pos    int // rows in each cache
	host   device.HostBuf
	ready  device.Event
	queued bool // logits copied back but not yet read
}

// server holds a run's state.
type server struct {
	cfg      Config
	dev      device.Device
	eng      *chameleon.Engine
	k        compute.Kernels
	blocks   []block
	emb, out *chameleon.Tensor
	sess     []*session
	it       *chameleon.Iteration
	rep      *Report
}

// Run serves cfg on dev: a fresh Engine and freshly filled weights, so two
// runs with the same seed decode the same bits.
func Run(dev device.Device, newKernels Kernels, cfg Config) (rep *Report, err error) {
	if cfg.Steps < 1 {
		return nil, fmt.Errorf("steps %d: want at least 1", cfg.Steps)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := append(backend.EngineOptions(cfg.Limit, cfg.Estimator, cfg.StepMS, cfg.MinSwap, cfg.Link), chameleon.WithSyncPlanning(cfg.SyncPlanning))
	eng, err := chameleon.New(dev, append(opts, cfg.Options...)...)
	if err != nil {
		return nil, err
	}
	s := &server{cfg: cfg, dev: dev, eng: eng, rep: &Report{Config: cfg}}
	defer func() {
		if cerr := s.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if s.k, err = newKernels(eng.ComputeStream()); err != nil {
		return nil, err
	}
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	if err := s.prefill(); err != nil {
		return s.rep, fmt.Errorf("prefill: %w", err)
	}
	start := time.Now()
	var prev chameleon.Stats
	for r := range cfg.Steps {
		t0 := time.Now()
		res, err := s.round()
		if err != nil {
			return s.rep, fmt.Errorf("round %d: %w", r, err)
		}
		st := eng.Stats()
		rd := Round{Index: r, Time: time.Since(t0), Result: res, Peak: st.PeakDeviceBytes,
			In: st.SwappedInBytes - prev.SwappedInBytes, Out: st.SwappedOutBytes - prev.SwappedOutBytes,
			Released: st.KeptEvictions - prev.KeptEvictions, OnDemand: st.OnDemandIn - prev.OnDemandIn}
		prev = st
		s.rep.Rounds = append(s.rep.Rounds, rd)
		if pr := res.Plan; res.Planned && pr != nil && pr.Exec != nil {
			s.rep.Sims = append(s.rep.Sims, pr.Exec)
		}
		if cfg.Progress != nil {
			cfg.Progress(rd)
		}
	}
	for _, ss := range s.sess {
		if err := s.read(ss); err != nil {
			return s.rep, err
		}
	}
	s.rep.Decode = time.Since(start)
	s.rep.Stats = eng.Stats()
	return s.rep, nil
}

// Seeds of the weights: tensor kind and block, so that every weight has
// its own numbers.
func weightSeed(seed uint64, kind, l int) uint64 {
	return seed*1000003 + uint64(kind)*7919 + uint64(l)*104729
}

// load makes every weight Frozen and fills it from the host.
func (s *server) load() error {
	m := s.cfg.Model
	d, f, v := m.Width, m.FFN, m.Vocab
	var buf []byte
	frozen := func(rows, cols int, seed uint64, scale float32, name string) (*chameleon.Tensor, error) {
		n := rows * cols
		t, err := s.eng.NewTensor(int64(n)*4, chameleon.Frozen, "float32", []int64{int64(rows), int64(cols)})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if cap(buf) < 4*n {
			buf = make([]byte, 4*n)
		}
		buf = buf[:4*n]
		uniformBytes(buf, seed, scale)
		if err := s.eng.Fill(t, buf); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return t, nil
	}
	var err error
	sd := float32(1 / math.Sqrt(float64(d)))
	if s.emb, err = frozen(v, d, weightSeed(s.cfg.Seed, 0, 0), 1, "embedding"); err != nil {
		return err
	}
	for l := range m.Layers {
		var b block
		if b.wk, err = frozen(d, d, weightSeed(s.cfg.Seed, 1, l), sd, "wk"); err != nil {
			return err
		}
		if b.w1, err = frozen(d, f, weightSeed(s.cfg.Seed, 2, l), 2*sd, "w1"); err != nil {
			return err
		}
		if b.w2, err = frozen(f, d, weightSeed(s.cfg.Seed, 3, l), float32(1/math.Sqrt(float64(f))), "w2"); err != nil {
			return err
		}
		s.blocks = append(s.blocks, b)
	}
	if s.out, err = frozen(d, v, weightSeed(s.cfg.Seed, 4, 0), 4*sd, "head"); err != nil {
		return err
	}
	for i := range m.Sessions {
		h, err := s.dev.AllocHost(int64(v) * 4)
		if err != nil {
			return err
		}
		ev, err := s.dev.NewEvent()
		if err != nil {
			s.dev.FreeHost(h)
			return err
		}
		s.sess = append(s.sess, &session{host: h, ready: ev, tok: int32((i*7 + 1) % v), pos: m.Prompt})
	}
	return nil
}

// uniformBytes fills b with the little-endian float32s compute.UniformAt
// gives (the same numbers a Uniform kernel writes), in parallel.
func uniformBytes(b []byte, seed uint64, scale float32) {
	n := len(b) / 4
	parts := min(runtime.GOMAXPROCS(0), max(1, n>>16))
	var wg sync.WaitGroup
	for p := range parts {
		wg.Go(func() {
			for i := p * n / parts; i < (p+1)*n/parts; i++ {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(compute.UniformAt(seed, uint64(i), scale)))
			}
		})
	}
	wg.Wait()
}

// op runs one op on the Engine: kernel queues its work between Before and
// After, reading addresses through Ptr.
func (s *server) op(name, module string, in, out []*chameleon.Tensor, kernel func() error) error {
	op := chameleon.Op{Name: name, Module: module, Phase: trace.PhaseForward, In: in, Out: out}
	if err := s.it.Before(&op); err != nil {
		return err
	}
	if err := kernel(); err != nil {
		return fmt.Errorf("%s %s: %w", name, module, err)
	}
	return s.it.After(&op)
}

func (s *server) tensor(elems int, shape ...int64) (*chameleon.Tensor, error) {
	return s.eng.NewTensor(int64(elems)*4, chameleon.Activation, "float32", shape)
}

// prefill is the first iteration: every session's caches, Prompt rows of
// numbers a Uniform kernel writes.
func (s *server) prefill() error {
	m := s.cfg.Model
	s.it = s.eng.Begin()
	for i, ss := range s.sess {
		for l := range m.Layers {
			c, err := s.tensor(m.Prompt*m.Width, int64(m.Prompt), int64(m.Width))
			if err != nil {
				return err
			}
			seed := weightSeed(s.cfg.Seed, 5+i, l)
			if err := s.op("kv.prefill", fmt.Sprintf("model.layers.%d.attn", l), nil, []*chameleon.Tensor{c}, func() error {
				return s.k.Uniform(c.Ptr(), m.Prompt*m.Width, seed, 1)
			}); err != nil {
				return err
			}
			ss.cache = append(ss.cache, c)
		}
		if err := s.hint(i); err != nil {
			return err
		}
	}
	return s.it.End().Err
}

// hint, after session i's turn, sends its caches off the device and asks
// for the next session's.
func (s *server) hint(i int) error {
	if !s.cfg.Hints || len(s.sess) < 2 {
		return nil
	}
	for _, c := range s.sess[i].cache {
		if err := s.eng.Evict(c); err != nil {
			return err
		}
	}
	for _, c := range s.sess[(i+1)%len(s.sess)].cache {
		if err := s.eng.Prefetch(c); err != nil {
			return err
		}
	}
	return nil
}

// round is one iteration: every session decodes a token, in turn.
func (s *server) round() (chameleon.Result, error) {
	s.it = s.eng.Begin()
	for i := range s.sess {
		if err := s.turn(i); err != nil {
			s.it.End()
			return chameleon.Result{}, err
		}
		if err := s.hint(i); err != nil {
			s.it.End()
			return chameleon.Result{}, err
		}
	}
	res := s.it.End()
	return res, res.Err
}

// read waits for a session's last logits, keeps their bytes and takes
// their argmax as its next token.
func (s *server) read(ss *session) error {
	if !ss.queued {
		return nil
	}
	if err := s.dev.SyncEvent(ss.ready); err != nil {
		return err
	}
	ss.queued = false
	b := ss.host.Bytes()
	s.rep.Logits = append(s.rep.Logits, b...)
	best, bi := float32(math.Inf(-1)), 0
	for j := 0; j < len(b)/4; j++ {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:])); v > best {
			best, bi = v, j
		}
	}
	ss.tok = int32(bi)
	s.rep.Tokens = append(s.rep.Tokens, ss.tok)
	return nil
}

// turn decodes one token of session i: its previous logits are read first
// (the host waits for them only now, a round later), then the blocks run
// and the logits are copied back without a wait.
func (s *server) turn(i int) error {
	m := s.cfg.Model
	ss := s.sess[i]
	if err := s.read(ss); err != nil {
		return err
	}
	d, f := m.Width, m.FFN
	x, err := s.tensor(d, 1, int64(d))
	if err != nil {
		return err
	}
	tok := int64(ss.tok)
	if err := s.op("embedding", "model.embed", []*chameleon.Tensor{s.emb}, []*chameleon.Tensor{x}, func() error {
		return s.dev.CopyD2D(x.Ptr(), s.emb.Ptr().Add(tok*int64(d)*4), int64(d)*4, s.eng.ComputeStream())
	}); err != nil {
		return err
	}
	pos := ss.pos
	for l, b := range s.blocks {
		mod := fmt.Sprintf("model.layers.%d", l)
		old := ss.cache[l]
		kv, err := s.tensor((pos+1)*d, int64(pos+1), int64(d))
		if err != nil {
			return err
		}
		if err := s.op("kv.append", mod+".attn", []*chameleon.Tensor{x, old, b.wk}, []*chameleon.Tensor{kv}, func() error {
			if err := s.dev.CopyD2D(kv.Ptr(), old.Ptr(), old.Size(), s.eng.ComputeStream()); err != nil {
				return err
			}
			return s.k.Gemm(false, false, 1, d, d, 1, x.Ptr(), b.wk.Ptr(), 0, kv.Ptr().Add(int64(pos*d)*4))
		}); err != nil {
			return err
		}
		if err := s.eng.Release(old); err != nil {
			return err
		}
		ss.cache[l] = kv
		sc, err := s.tensor(pos+1, 1, int64(pos+1))
		if err != nil {
			return err
		}
		if err := s.op("attn.scores", mod+".attn", []*chameleon.Tensor{x, kv}, []*chameleon.Tensor{sc}, func() error {
			if err := s.k.Gemm(false, true, 1, pos+1, d, float32(1/math.Sqrt(float64(d))), x.Ptr(), kv.Ptr(), 0, sc.Ptr()); err != nil {
				return err
			}
			return s.k.BiasAct(sc.Ptr(), sc.Ptr(), 0, 1, pos+1, compute.Tanh)
		}); err != nil {
			return err
		}
		h, err := s.tensor(d, 1, int64(d))
		if err != nil {
			return err
		}
		if err := s.op("attn.mix", mod+".attn", []*chameleon.Tensor{sc, kv, x}, []*chameleon.Tensor{h}, func() error {
			if err := s.k.Gemm(false, false, 1, d, pos+1, 1/float32(pos+1), sc.Ptr(), kv.Ptr(), 0, h.Ptr()); err != nil {
				return err
			}
			return s.k.Add(h.Ptr(), h.Ptr(), x.Ptr(), d)
		}); err != nil {
			return err
		}
		if err := release(s.eng, sc, x); err != nil {
			return err
		}
		u, err := s.tensor(f, 1, int64(f))
		if err != nil {
			return err
		}
		if err := s.op("mlp.up", mod+".mlp", []*chameleon.Tensor{h, b.w1}, []*chameleon.Tensor{u}, func() error {
			if err := s.k.Gemm(false, false, 1, f, d, 1, h.Ptr(), b.w1.Ptr(), 0, u.Ptr()); err != nil {
				return err
			}
			return s.k.BiasAct(u.Ptr(), u.Ptr(), 0, 1, f, compute.Tanh)
		}); err != nil {
			return err
		}
		y, err := s.tensor(d, 1, int64(d))
		if err != nil {
			return err
		}
		if err := s.op("mlp.down", mod+".mlp", []*chameleon.Tensor{u, b.w2, h}, []*chameleon.Tensor{y}, func() error {
			if err := s.k.Gemm(false, false, 1, d, f, 1, u.Ptr(), b.w2.Ptr(), 0, y.Ptr()); err != nil {
				return err
			}
			return s.k.Add(y.Ptr(), y.Ptr(), h.Ptr(), d)
		}); err != nil {
			return err
		}
		if err := release(s.eng, u, h); err != nil {
			return err
		}
		x = y
	}
	ss.pos++
	v := m.Vocab
	logits, err := s.tensor(v, 1, int64(v))
	if err != nil {
		return err
	}
	if err := s.op("head", "model.head", []*chameleon.Tensor{x, s.out}, []*chameleon.Tensor{logits}, func() error {
		if err := s.k.Gemm(false, false, 1, v, d, 1, x.Ptr(), s.out.Ptr(), 0, logits.Ptr()); err != nil {
			return err
		}
		// The logits come back on the compute stream, behind the head:
		// the host waits for them at the session's next turn.
		if err := s.dev.CopyD2H(ss.host, logits.Ptr(), s.eng.ComputeStream()); err != nil {
			return err
		}
		return s.dev.Record(ss.ready, s.eng.ComputeStream())
	}); err != nil {
		return err
	}
	ss.queued = true
	return release(s.eng, x, logits)
}

func release(eng *chameleon.Engine, ts ...*chameleon.Tensor) error {
	for _, t := range ts {
		if err := eng.Release(t); err != nil {
			return err
		}
	}
	return nil
}

// close waits for the device, then gives back the sessions' host buffers
// and events and closes the Engine.
func (s *server) close() error {
	err := s.dev.SyncStream(s.eng.ComputeStream())
	for _, ss := range s.sess {
		err = errors.Join(err, s.dev.FreeHost(ss.host), s.dev.DestroyEvent(ss.ready))
	}
	return errors.Join(err, s.eng.Close())
}
