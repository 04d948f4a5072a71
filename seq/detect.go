package seq

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// Stage is where the swap policy's life cycle stands.
type Stage uint8

// Stages. An iteration runs WARMUP while its sequence has been the same for
// at most M iterations, GEN_POLICY for the N iterations after that (detailed
// profiling and planning), then STABLE (the policy applies). Any change
// returns to WARMUP.
const (
	Warmup Stage = iota
	GenPolicy
	Stable
)

func (s Stage) String() string {
	switch s {
	case Warmup:
		return "WARMUP"
	case GenPolicy:
		return "GEN_POLICY"
	case Stable:
		return "STABLE"
	}
	return fmt.Sprintf("Stage(%d)", uint8(s))
}

// MarshalText makes stages print as their names in JSON.
func (s Stage) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Config holds the detection thresholds. The zero value is not useful; start
// from DefaultConfig.
type Config struct {
	// MinSimilarity: a bigram cosine below it is a change (paper: 0.95).
	MinSimilarity float64
	// MaxLengthDelta: a relative change of op count above it is a change
	// (paper: 5%).
	MaxLengthDelta float64
	// MaxMemoryDelta: a relative change of the bytes the ops allocate above
	// it is a change. The paper has no such rule; without it a sequence
	// length or batch change (same ops, other sizes) would keep a policy
	// planned for smaller tensors and overflow memory.
	MaxMemoryDelta float64
	// M is the number of iterations with an unchanged sequence spent in
	// WARMUP, N the number then spent in GEN_POLICY.
	M, N int
	// Logger, when set, gets one debug record per iteration (sequence hash,
	// measures, and why a change was declared).
	Logger *slog.Logger
}

// DefaultConfig returns the paper's thresholds: cosine >= 0.95, length and
// memory change <= 5%, m = 5, n = 3.
func DefaultConfig() Config {
	return Config{MinSimilarity: 0.95, MaxLengthDelta: 0.05, MaxMemoryDelta: 0.05, M: 5, N: 3}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch {
	case c.MinSimilarity < 0 || c.MinSimilarity > 1:
		return fmt.Errorf("seq: similarity threshold %g outside [0, 1]", c.MinSimilarity)
	case c.MaxLengthDelta < 0:
		return fmt.Errorf("seq: negative length threshold %g", c.MaxLengthDelta)
	case c.MaxMemoryDelta < 0:
		return fmt.Errorf("seq: negative memory threshold %g", c.MaxMemoryDelta)
	case c.M < 1 || c.N < 0:
		return fmt.Errorf("seq: stage counts m=%d n=%d: want m >= 1, n >= 0", c.M, c.N)
	}
	return nil
}

// Result is Detect's verdict on one iteration.
type Result struct {
	Stage       Stage   // the stage this iteration is in
	Changed     bool    // differs from the previous iteration beyond the thresholds
	Similarity  float64 // bigram cosine with the previous iteration (1 for the first)
	LengthDelta float64 // |len - prev| / prev
	MemoryDelta float64 // |bytes - prev| / prev
	Hash        uint64  // hash of the token sequence
	Reason      string  // why a change was declared; empty when none
}

// Detector runs the stage machine over successive iteration profiles.
type Detector struct {
	cfg  Config
	prev Profile
	have bool
	run  int // iterations in a row with the same sequence, this one included
}

// NewDetector returns a Detector; cfg must be valid.
func NewDetector(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Detector{cfg: cfg}, nil
}

// stageOf derives the stage from how long the sequence has held.
func (d *Detector) stageOf(run int) Stage {
	switch {
	case run <= d.cfg.M:
		return Warmup
	case run <= d.cfg.M+d.cfg.N:
		return GenPolicy
	}
	return Stable
}

// Next is the stage the next iteration will be in if its sequence does not
// change.
func (d *Detector) Next() Stage { return d.stageOf(d.run + 1) }

// Adopt marks the current sequence as having a policy already (one found in
// a policy cache): later unchanged iterations are STABLE with no WARMUP.
func (d *Detector) Adopt() { d.run = max(d.run, d.cfg.M+d.cfg.N) }

// Observe compares p with the previous iteration's profile and advances the
// stage machine.
func (d *Detector) Observe(p Profile) Result {
	r := Result{Similarity: 1, Hash: p.Hash}
	if d.have {
		r.Similarity = Similarity(&d.prev, &p)
		r.LengthDelta = RelDelta(float64(p.Len), float64(d.prev.Len))
		r.MemoryDelta = RelDelta(float64(p.Bytes), float64(d.prev.Bytes))
		var why []string
		if r.Similarity < d.cfg.MinSimilarity {
			why = append(why, fmt.Sprintf("similarity %.4f < %.4f", r.Similarity, d.cfg.MinSimilarity))
		}
		if r.LengthDelta > d.cfg.MaxLengthDelta {
			why = append(why, fmt.Sprintf("length %d -> %d (%.1f%% > %.1f%%)", d.prev.Len, p.Len, 100*r.LengthDelta, 100*d.cfg.MaxLengthDelta))
		}
		if r.MemoryDelta > d.cfg.MaxMemoryDelta {
			why = append(why, fmt.Sprintf("allocated bytes %d -> %d (%.1f%% > %.1f%%)", d.prev.Bytes, p.Bytes, 100*r.MemoryDelta, 100*d.cfg.MaxMemoryDelta))
		}
		if len(why) > 0 {
			r.Changed = true
			r.Reason = strings.Join(why, "; ")
		}
	}
	if r.Changed || !d.have {
		d.run = 1
	} else {
		d.run++
	}
	d.prev, d.have = p, true
	r.Stage = d.stageOf(d.run)
	if l := d.cfg.Logger; l != nil && l.Enabled(context.Background(), slog.LevelDebug) {
		l.Debug("seqchange", "hash", fmt.Sprintf("%016x", p.Hash), "ops", p.Len, "bytes", p.Bytes,
			"similarity", r.Similarity, "length_delta", r.LengthDelta, "memory_delta", r.MemoryDelta,
			"changed", r.Changed, "reason", r.Reason, "stage", r.Stage.String())
	}
	return r
}

// RelDelta is the relative change |cur-prev|/prev, and 1 when prev is 0
// and cur is not: the one rule the detector and the policy cache compare
// sizes by.
func RelDelta(cur, prev float64) float64 {
	if prev == 0 {
		if cur == 0 {
			return 0
		}
		return 1
	}
	d := (cur - prev) / prev
	if d < 0 {
		d = -d
	}
	return d
}

// DebugEnabled reports whether a CHAMELEON_DEBUG value (a comma-separated
// list) asks for topic, e.g. "seqchange".
func DebugEnabled(env, topic string) bool {
	for f := range strings.SplitSeq(env, ",") {
		if strings.TrimSpace(f) == topic || strings.TrimSpace(f) == "all" {
			return true
		}
	}
	return false
}
