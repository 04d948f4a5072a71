package chameleon

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// policyKey is a sequence signature: the hash of its op names in order
// (stable across processes), its length, and the bytes its ops allocate.
// Two iterations share a policy when hash and length agree and the bytes
// are within the detection's memory threshold.
type policyKey struct {
	Hash  uint64 `json:"hash"`
	Ops   int    `json:"ops"`
	Bytes int64  `json:"bytes"`
}

// same reports whether two signatures name the same sequence: equal op
// names in order and, within memDelta, the same allocated bytes.
func (k policyKey) same(o policyKey, memDelta float64) bool {
	return k.Hash == o.Hash && k.Ops == o.Ops && seq.RelDelta(float64(k.Bytes), float64(o.Bytes)) <= memDelta
}

// policyCache keeps the policies of the sequences seen, so a sequence that
// comes back (dynamic sequence lengths: 2048 -> 1024 -> 2048) reuses its
// policy with no new warm-up.
type policyCache struct {
	byHash map[uint64][]*policy
}

func newPolicyCache() *policyCache { return &policyCache{byHash: map[uint64][]*policy{}} }

func (c *policyCache) get(k policyKey, memDelta float64) *policy {
	for _, p := range c.byHash[k.Hash] {
		if k.same(p.key, memDelta) {
			return p
		}
	}
	return nil
}

func (c *policyCache) put(p *policy) {
	c.drop(p.key)
	c.byHash[p.key.Hash] = append(c.byHash[p.key.Hash], p)
}

func (c *policyCache) drop(k policyKey) {
	ps := c.byHash[k.Hash]
	for i, p := range ps {
		if p.key == k {
			c.byHash[k.Hash] = append(ps[:i:i], ps[i+1:]...)
			return
		}
	}
}

func (c *policyCache) len() int {
	n := 0
	for _, ps := range c.byHash {
		n += len(ps)
	}
	return n
}

// savedPolicy is the file form of a policy: names instead of the
// process-local tokens.
type savedPolicy struct {
	Key     policyKey       `json:"key"`
	Swaps   []savedSwap     `json:"swaps"`
	Tensors []plannedTensor `json:"tensors"`
}

// savedSwap is a swap in the policy file. It is the file's own type, so
// that the simulator's may change without changing the format; the names
// are those of the plan report.
type savedSwap struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Out    int            `json:"out_after_op"`
	Free   int            `json:"freed_at_op"`
	In     int            `json:"in_issue_op"`
	Use    int            `json:"in_before_op"`
}

func (s savedSwap) swap() simulate.Swap {
	return simulate.Swap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use}
}

func saveSwap(s simulate.Swap) savedSwap {
	return savedSwap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use}
}

type savedCache struct {
	Format   string        `json:"format"`
	Policies []savedPolicy `json:"policies"`
}

const policyFormat = "chameleon-policies/v1"

// SavePolicies writes the policy cache, so a restarted or migrated job
// starts STABLE on the sequences it has seen (LoadPolicies).
func (e *Engine) SavePolicies(w io.Writer) error {
	out := savedCache{Format: policyFormat}
	for _, ps := range e.cache.byHash {
		for _, p := range ps {
			// Swaps of persistent tensors name this process's handles and
			// are left out: a restarted job has other ones.
			sp := savedPolicy{Key: p.key}
			for i, s := range p.swaps {
				if p.fixed[i] != nil {
					continue
				}
				sp.Swaps = append(sp.Swaps, saveSwap(s))
				sp.Tensors = append(sp.Tensors, p.tensors[i])
			}
			out.Policies = append(out.Policies, sp)
		}
	}
	enc := json.NewEncoder(w)
	return enc.Encode(out)
}

// LoadPolicies adds the policies SavePolicies wrote to the cache. The
// first iteration whose sequence matches one adopts it and the next runs
// STABLE.
func (e *Engine) LoadPolicies(r io.Reader, name string) error {
	var in savedCache
	dec := json.NewDecoder(r)
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("chameleon: policies %s: %w", name, err)
	}
	if in.Format != policyFormat {
		return fmt.Errorf("chameleon: policies %s: field \"format\": %q, want %q", name, in.Format, policyFormat)
	}
	// All or nothing: a damaged file adds no policy.
	loaded := make([]*policy, 0, len(in.Policies))
	for i, sp := range in.Policies {
		if len(sp.Tensors) != len(sp.Swaps) {
			return fmt.Errorf("chameleon: policies %s: policies[%d]: %d swaps but %d tensors", name, i, len(sp.Swaps), len(sp.Tensors))
		}
		swaps := make([]simulate.Swap, len(sp.Swaps))
		for j, s := range sp.Swaps {
			swaps[j] = s.swap()
			if err := swaps[j].Validate(sp.Key.Ops); err != nil {
				return fmt.Errorf("chameleon: policies %s: policies[%d].swaps[%d]: %w", name, i, j, err)
			}
		}
		loaded = append(loaded, newPolicy(sp.Key, e.cfg.match, e.enc.Vocab, swaps, sp.Tensors, nil, nil, nil, nil, nil, false))
	}
	for _, p := range loaded {
		e.cache.put(p)
	}
	return nil
}

// SavePolicyFile writes the policy cache to path.
func (e *Engine) SavePolicyFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := e.SavePolicies(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// LoadPolicyFile reads a policy cache written by SavePolicyFile.
func (e *Engine) LoadPolicyFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return e.LoadPolicies(f, path)
}

// CachedPolicies is the number of policies in the cache.
func (e *Engine) CachedPolicies() int { return e.cache.len() }
