package chameleon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/internal/policyfile"
	"github.com/chameleon-go/chameleon/plan"
)

// Data-parallel ranks (docs/policy.md, "Data-parallel ranks"): Engines
// that run the same sequence, one per device, plan it once. Rank 0
// profiles and plans; at the iteration where each rank would plan a
// sequence it has no policy for, every rank takes part in one broadcast
// from rank 0 over the host's PolicyChannel: rank 0 sends the policy it
// planned, in the policy file's encoding (a file of one policy), or a file
// of none when it found none; the other ranks adopt it instead of
// planning. A rank that gets no policy for its sequence (rank 0 found
// none, saw another sequence, or the broadcast failed or timed out) plans
// on its own. An adopted policy is checked like any other against the
// rank's own iterations (matching, the stale check), and planned again
// there when it does not fit.

// PolicyChannel is the host's collective broadcast from rank 0, over
// whatever it already runs between its ranks (its framework's broadcast,
// NCCL through its own bindings, a socket, any byte channel). The Engine
// never opens a connection of its own; NewLocalChannel is an in-process
// one.
type PolicyChannel interface {
	// Broadcast is one broadcast from rank 0 to every rank. Each rank calls
	// it once per exchange, the exchanges in the same order on every rank:
	// rank 0 with the payload, the others with nil. It returns rank 0's
	// payload on every rank (rank 0 may return its own data or nil). Payloads
	// have any length: a collective that needs the size first broadcasts it
	// first. It must return when ctx is done (WithRankTimeout), with an
	// error; it may return as soon as rank 0's payload is on its way (a
	// buffered channel) or when every rank has it (a collective). Each rank
	// calls it from one goroutine at a time: the one that calls End.
	Broadcast(ctx context.Context, payload []byte) ([]byte, error)
}

// DefaultRankTimeout is how long a rank waits in one exchange by default:
// ample for rank 0 to plan a large iteration.
const DefaultRankTimeout = 5 * time.Minute

type rankConfig struct {
	rank, ranks int
	ch          PolicyChannel
	timeout     time.Duration
	// hostTotal is a node's pinned host memory, shared by hostRanks ranks.
	hostTotal int64
	hostRanks int
}

// rankState is an Engine's side of the exchanges.
type rankState struct {
	// down is why the channel is no longer used: a failed or timed-out
	// exchange leaves the ranks out of step, so this rank plans on its own
	// from then on (and rank 0 sends no more).
	down error
	// trimmed is the policy whose start trimKept saw last.
	trimmed *policy
}

// WithRank makes the Engine rank rank of ranks data-parallel ranks that
// run the same sequence, exchanging policies over ch: rank 0 plans and
// broadcasts what it planned, the others adopt it (Stats.AdoptedPolicies)
// instead of planning, and plan on their own only when no policy for their
// sequence comes (Stats.RankFallbacks). Every rank calls ch.Broadcast at
// the same iterations (the first plan of each sequence), so they must run
// their iterations in step, as data parallelism does; give every rank the
// same policy file or none. A rank waits for rank 0 at most
// WithRankTimeout in an exchange (in data-parallel training rank 0's
// planning holds the next gradient exchange anyway). With ranks 1 the
// option does nothing.
func WithRank(rank, ranks int, ch PolicyChannel) Option {
	return optionFunc(func(c *config) { c.ranks.rank, c.ranks.ranks, c.ranks.ch = rank, ranks, ch })
}

// WithRankTimeout sets how long a rank waits in one exchange of WithRank
// (default DefaultRankTimeout). A rank whose exchange fails or times out
// plans on its own and exchanges no more.
func WithRankTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ranks.timeout = d })
}

// WithHostBudget shares a node's pinned host memory, total bytes, between
// the ranksOnNode Engines of the node: each reserves its share (total /
// ranksOnNode, rounded down to device.BlockSize) up front, never pins
// more, and plans within it: a policy whose swaps hold more pinned memory
// at once than the share is refused at that tier of the limit and the
// next is tried (plan.WithHostLimit). Warm-up iterations, before a policy,
// evict into the same share; an eviction that does not fit is
// ErrOutOfMemory. A policy adopted from rank 0 or loaded that holds more
// than the share is updated to it.
func WithHostBudget(total int64, ranksOnNode int) Option {
	return optionFunc(func(c *config) { c.ranks.hostTotal, c.ranks.hostRanks = total, ranksOnNode })
}

// active says whether the Engine exchanges policies.
func (r *rankConfig) active() bool { return r.ranks > 1 && r.ch != nil }

// hostShare is this rank's share of the node's pinned memory (0: no budget).
func (r *rankConfig) hostShare() int64 {
	if r.hostTotal <= 0 || r.hostRanks < 1 {
		return 0
	}
	return r.hostTotal / int64(r.hostRanks) &^ (device.BlockSize - 1)
}

func (c *config) validateRanks() error {
	r := &c.ranks
	if r.ranks < 0 || (r.ranks > 0 && (r.rank < 0 || r.rank >= r.ranks)) || (r.ranks == 0 && r.rank != 0) {
		return fmt.Errorf("chameleon: WithRank(%d, %d): want 0 <= rank < ranks", r.rank, r.ranks)
	}
	if r.ranks > 1 && r.ch == nil {
		return fmt.Errorf("chameleon: WithRank(%d, %d): nil channel", r.rank, r.ranks)
	}
	if r.timeout < 0 {
		return fmt.Errorf("chameleon: WithRankTimeout(%v): negative", r.timeout)
	}
	if r.hostTotal != 0 || r.hostRanks != 0 {
		if r.hostTotal <= 0 || r.hostRanks < 1 {
			return fmt.Errorf("chameleon: WithHostBudget(%d, %d): want positive bytes and at least 1 rank", r.hostTotal, r.hostRanks)
		}
		if s := r.hostShare(); s < device.BlockSize {
			return fmt.Errorf("chameleon: WithHostBudget(%d, %d): a share of %d bytes is below one %d-byte block", r.hostTotal, r.hostRanks, s, device.BlockSize)
		}
		if c.hostReserve > r.hostShare() {
			return fmt.Errorf("chameleon: WithHostReserve(%d) above the share of WithHostBudget(%d, %d), %d bytes", c.hostReserve, r.hostTotal, r.hostRanks, r.hostShare())
		}
	}
	return nil
}

// hostPool is how the Engine's pinned pool is made: with a budget, its
// share reserved and no growth; otherwise WithHostReserve's bytes (if any)
// and 64 MiB segments as needed.
func (c *config) hostPool() (opts []device.MemOption, reserve int64) {
	if s := c.ranks.hostShare(); s > 0 {
		return nil, s
	}
	return []device.MemOption{device.WithGrowth(64 << 20)}, c.hostReserve
}

// hostSlack is how much more pinned memory than a policy's swaps hold at
// once the host pool reserves when the policy comes into force (see
// reserveHost), in quarters: room for the pool's fragmentation.
const hostSlack = 5

// reserveHost makes the host pool, once per policy, hold what is in use
// now (host copies kept, swaps still out) and hostSlack/4 of the pinned
// memory the policy's swaps hold at once, the rest in one slab: a pool
// that grows a slab at a time as requests fail to fit fragments, and on
// CUDA each slab is a cudaHostAlloc that pins its pages while the host
// waits (a hundred milliseconds and more a GB), in the middle of a step.
// A fixed host budget (WithHostBudget, WithHostReserve) is left as it is;
// a reservation that fails leaves the pool to grow as before.
func (e *Engine) reserveHost(p *policy) {
	if p.hostReserved || p.prof == nil || e.cfg.ranks.hostShare() > 0 || e.cfg.hostReserve > 0 {
		return
	}
	p.hostReserved = true
	st := e.pool.Stats()
	want := st.Allocated + plan.HostPeak(p.prof.iter, p.swaps)/4*hostSlack
	if have := st.Reserved; want > have {
		if err := e.pool.Reserve(want - have); err != nil {
			e.cfg.logger.Warn("chameleon: pinned host memory for the policy's swaps not reserved; the pool grows as they need", "bytes", want-have, "err", err)
		}
	}
}

// hostPlanPct is the share of the pinned memory a plan may fill: the rest
// is room for what the iteration a policy starts in still holds from its
// warm-up (tensors evicted then, not used yet), for copies given back
// behind a copy still running, and for the pool's fragmentation.
const hostPlanPct = 90

// hostPlanLimit is the pinned memory a plan may hold at once:
// hostPlanPct of the share (0: no budget).
func (r *rankConfig) hostPlanLimit() int64 { return r.hostShare() / 100 * hostPlanPct }

// hostPlan is the planning path's host limit.
func (c *config) hostPlan() []plan.Option {
	if s := c.ranks.hostPlanLimit(); s > 0 {
		return []plan.Option{plan.WithHostLimit(s)}
	}
	return nil
}

// trimKept, under a host budget, gives back when a policy comes into force
// the host copies kept of parameters and optimizer state that it does not
// move (those of warm-up evictions): the policy's share of pinned memory
// counts only the copies of the tensors it swaps.
func (e *Engine) trimKept() error {
	p := e.policy
	if e.cfg.ranks.hostShare() == 0 || p == e.rank.trimmed {
		return nil
	}
	e.rank.trimmed = p
	moved := make(map[*Tensor]bool, len(p.fixed))
	for _, t := range p.fixed {
		if t != nil {
			moved[t] = true
		}
	}
	var errs []error
	for _, t := range e.live {
		if t.kept && !moved[t] {
			errs = append(errs, e.unkeep(t))
		}
	}
	return errors.Join(errs...)
}

// hostBuf is a pinned buffer for t's copy out. When the pool has none (a
// host budget's share is all in use), the host copies kept of resident
// parameters and optimizer state are given back, least recently used
// first, until one fits: a kept copy only saves a copy, a buffer refused
// fails the swap.
func (e *Engine) hostBuf(t *Tensor) (device.HostBuf, error) {
	buf, err := e.pool.Get(t.size, e.d2h)
	if err == nil || !errors.Is(err, device.ErrOutOfMemory) {
		return buf, err
	}
	var kept []*Tensor
	for _, x := range e.live {
		if x.kept && x != t {
			kept = append(kept, x)
		}
	}
	slices.SortFunc(kept, func(a, b *Tensor) int { return cmp.Compare(a.lastUse, b.lastUse) })
	for _, x := range kept {
		if uerr := e.unkeep(x); uerr != nil {
			return buf, errors.Join(err, uerr)
		}
		if buf, err = e.pool.Get(t.size, e.d2h); err == nil || !errors.Is(err, device.ErrOutOfMemory) {
			return buf, err
		}
	}
	return buf, err
}

func (e *Engine) rankTimeout() time.Duration {
	if t := e.cfg.ranks.timeout; t > 0 {
		return t
	}
	return DefaultRankTimeout
}

// receives says whether a plan the ranks exchange is, on this rank, rank
// 0's policy to receive: a rank other than 0, with the channel up.
func (e *Engine) receives(req controller.Request) bool {
	return req.Exchange && e.cfg.ranks.rank != 0 && e.rank.down == nil
}

// landShared is a rank other than 0 once rank 0's broadcast came (or
// failed): it adopts the policy when it is for the sequence planned,
// otherwise (rank 0 had none, or one for another sequence, or the
// broadcast failed) it plans on its own, on the worker.
func (e *Engine) landShared(ctx context.Context, j *planJob, r *Result) {
	rc := &e.cfg.ranks
	key := j.req.Key
	fallback := func(why string, args ...any) {
		e.stats.RankFallbacks++
		e.cfg.logger.Info("chameleon: no policy from rank 0, planning here: "+why, append([]any{"rank", rc.rank}, args...)...)
		e.startPlan(ctx, j.req, j.snap, false)
	}
	if j.err != nil {
		e.rank.down = j.err
		fallback("the broadcast failed", "err", j.err)
		return
	}
	ps, err := e.decodeShared(j.payload)
	if err != nil {
		fallback("its policy is refused", "err", err)
		return
	}
	var p *policy
	for _, q := range ps {
		if e.cache.same(q.key, key) {
			p = q
			continue
		}
		e.cache.put(q) // another sequence: this rank may meet it later
	}
	if p == nil {
		if len(ps) == 0 {
			fallback("rank 0 found none")
		} else {
			fallback("rank 0 planned another sequence", "ops", key.Ops, "rank0_ops", ps[0].key.Ops)
		}
		return
	}
	l := e.ctl.Landed(j.req, controller.Result{Shared: true})
	e.cache.put(p)
	e.stats.AdoptedPolicies++
	r.Adopted = true
	e.applyLanded(p, l)
	e.cfg.logger.Debug("chameleon: policy adopted from rank 0", "rank", rc.rank, "swaps", len(p.swaps), "recomputes", len(p.recomputes))
}

// decodeShared makes the policies of a broadcast payload (a policy file),
// each fitted to this Engine: updated when planned under another limit,
// link or device, or when it holds more pinned memory than this rank's
// share.
func (e *Engine) decodeShared(data []byte) ([]*policy, error) {
	if len(data) > policyfile.MaxFileBytes {
		return nil, fmt.Errorf("%d bytes, above the %d a policy file may have", len(data), policyfile.MaxFileBytes)
	}
	fc, err := policyfile.Decode(data, policyfile.Config{MaxTensor: e.cfg.limit})
	if err != nil {
		return nil, err
	}
	fps := fc.Policies
	env, share := e.env(), e.cfg.ranks.hostPlanLimit()
	out := make([]*policy, 0, len(fps))
	for i := range fps {
		p := e.decodePolicy(&fps[i])
		if p.prof != nil && ((p.env.known() && p.env != env) || (share > 0 && plan.HostPeak(p.prof.iter, p.swaps) > share)) {
			up, err := e.update(p)
			if err != nil {
				return nil, fmt.Errorf("policy %d: not updated to this rank: %w", i, err)
			}
			p = up
		}
		out = append(out, p)
	}
	return out, nil
}

// shareOutcome is rank 0 after the plan of a sequence it had no policy
// for: it broadcasts the policy (pol, when err is nil) or a file of none,
// on the worker.
func (e *Engine) shareOutcome(pol *policy, err error) {
	rc := &e.cfg.ranks
	if rc.rank != 0 || e.rank.down != nil {
		return
	}
	var ps []*policy
	if err == nil && pol != nil {
		ps = []*policy{pol}
	}
	data, encErr := encodeCache(ps, nil)
	if encErr != nil {
		data, _ = encodeCache(nil, nil) // the others must not wait in vain
	}
	s := &sendJob{shared: len(ps) > 0 && encErr == nil, done: make(chan struct{})}
	e.sends = append(e.sends, s)
	timeout, ch := e.rankTimeout(), rc.ch
	e.workers.Go(func() error {
		defer close(s.done)
		ctx, cancel := context.WithTimeout(e.work, timeout)
		_, s.err = ch.Broadcast(ctx, data)
		cancel()
		return nil
	})
}

// sent is rank 0 once a broadcast is done.
func (e *Engine) sent(s *sendJob) {
	if s.err != nil {
		if e.rank.down == nil {
			e.rank.down = s.err
			e.cfg.logger.Warn("chameleon: policy broadcast failed; the other ranks plan on their own", "err", s.err)
		}
		return
	}
	if s.shared {
		e.stats.SharedPolicies++
	}
}

// ErrChannelClosed is returned by a LocalChannel's Broadcast once the
// channel is closed.
var ErrChannelClosed = errors.New("chameleon: policy channel closed")

// LocalChannel is one rank's end of an in-process PolicyChannel
// (NewLocalChannel), for Engines of one process and for tests: rank 0's
// Broadcast queues its payload for every other rank (up to 16 each, then
// it waits) and returns; another rank's takes the next payload queued for
// it, waiting for one.
type LocalChannel struct {
	g    *localGroup
	rank int
}

type localGroup struct {
	q      []chan []byte // per rank; q[0] unused
	closed chan struct{}
	once   sync.Once
}

// NewLocalChannel returns the n connected ends of an in-process channel,
// end i for rank i.
func NewLocalChannel(n int) []*LocalChannel {
	g := &localGroup{q: make([]chan []byte, n), closed: make(chan struct{})}
	ends := make([]*LocalChannel, n)
	for i := range ends {
		g.q[i] = make(chan []byte, 16)
		ends[i] = &LocalChannel{g: g, rank: i}
	}
	return ends
}

// Broadcast implements PolicyChannel.
func (c *LocalChannel) Broadcast(ctx context.Context, payload []byte) ([]byte, error) {
	g := c.g
	if c.rank == 0 {
		for i := 1; i < len(g.q); i++ {
			select {
			case <-g.closed:
				return nil, ErrChannelClosed
			default:
			}
			select {
			case g.q[i] <- slices.Clone(payload):
			case <-g.closed:
				return nil, ErrChannelClosed
			case <-ctx.Done():
				return nil, fmt.Errorf("chameleon: broadcast to rank %d: %w", i, ctx.Err())
			}
		}
		return payload, nil
	}
	select {
	case d := <-g.q[c.rank]: // what was sent before a Close still arrives
		return d, nil
	default:
	}
	select {
	case d := <-g.q[c.rank]:
		return d, nil
	case <-g.closed:
		return nil, ErrChannelClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("chameleon: rank %d waiting for rank 0: %w", c.rank, ctx.Err())
	}
}

// Close closes the channel for every rank: broadcasts under way and later
// return ErrChannelClosed (a payload already queued is still delivered). A
// host closes it when a rank fails, so that no other waits its timeout.
func (c *LocalChannel) Close() error {
	c.g.once.Do(func() { close(c.g.closed) })
	return nil
}
