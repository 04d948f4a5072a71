package chameleon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"

	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/internal/policyfile"
	"github.com/chameleon-go/chameleon/simulate"
)

// policyKey is a sequence signature (controller.Key): two iterations
// share a policy when it is the same.
type policyKey = controller.Key

// policyCache keeps the policies of the sequences seen, so a sequence that
// comes back (dynamic sequence lengths: 2048 -> 1024 -> 2048) reuses its
// policy with no new warm-up.
type policyCache struct {
	byHash map[uint64][]*policy
	// memDelta is the detection's memory threshold: the one rule of what
	// is the same sequence (controller.Key.Same), held here once.
	memDelta float64
}

func newPolicyCache(memDelta float64) *policyCache {
	return &policyCache{byHash: map[uint64][]*policy{}, memDelta: memDelta}
}

func (c *policyCache) get(k policyKey) *policy {
	for _, p := range c.byHash[k.Hash] {
		if c.same(k, p.key) {
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

// SavePolicies writes the policy cache in the policy file's format
// (version 2, docs/policy.md): every policy with all its swaps, those of
// parameters and optimizer state too, its recomputes, what it assumed
// (limit, link, device) and the profiled iteration it was planned from,
// so a restarted or migrated job starts STABLE on the sequences it has
// seen (LoadPolicies) and can plan them again without profiling. Called
// between iterations, it first waits for a plan in flight on the worker,
// so that the file holds it.
func (e *Engine) SavePolicies(w io.Writer) error {
	if e.isClosed() {
		return ErrClosed
	}
	data, err := e.encodePolicies()
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

func (e *Engine) encodePolicies() ([]byte, error) {
	// Between iterations, a plan in flight is waited for and taken, so
	// that the file holds it.
	if e.lock() == nil {
		if !e.it.active {
			e.landWith(context.Background(), &Result{}, true)
		}
		e.mu.Unlock()
	}
	var ps []*policy
	for _, l := range e.cache.byHash {
		ps = append(ps, l...)
	}
	slices.SortFunc(ps, func(a, b *policy) int {
		return cmp.Or(cmp.Compare(a.key.Hash, b.key.Hash), cmp.Compare(a.key.Ops, b.key.Ops), cmp.Compare(a.key.Bytes, b.key.Bytes))
	})
	var last *policyKey
	if k, ok := e.ctl.Latest(); ok {
		if p := e.cache.get(k); p != nil {
			last = &p.key
		}
	}
	return encodeCache(ps, last)
}

// encodeCache is the policy file of ps, in their order.
func encodeCache(ps []*policy, last *policyKey) ([]byte, error) {
	out := policyfile.File{Last: last}
	for _, p := range ps {
		out.Policies = append(out.Policies, encodePolicy(p))
	}
	data, err := policyfile.Encode(out)
	if err != nil {
		return nil, fmt.Errorf("chameleon: encode policies: %w", err)
	}
	return data, nil
}

// LoadPolicies adds the policies SavePolicies wrote (or a version 1 file
// wrote) to the cache, after checking every field; name is the file's name
// in errors. All or nothing: a file with one bad field adds no policy, and
// the error names the file, the field and the entry. A policy planned
// under another limit, link or device is updated to this Engine's
// (Stats.PolicyUpdates). The first iteration whose sequence matches one
// adopts it and the next runs STABLE.
func (e *Engine) LoadPolicies(r io.Reader, name string) error {
	if e.isClosed() {
		return ErrClosed
	}
	data, err := io.ReadAll(io.LimitReader(r, policyfile.MaxFileBytes+1))
	if err != nil {
		return fmt.Errorf("chameleon: policy file %s: %w", name, err)
	}
	fc, err := policyfile.Decode(data, policyfile.Config{MaxTensor: e.cfg.limit})
	if err != nil {
		return fmt.Errorf("chameleon: policy file %s: %w", name, err)
	}
	fps := fc.Policies
	loaded := make([]*policy, 0, len(fps))
	for i := range fps {
		loaded = append(loaded, e.decodePolicy(&fps[i]))
	}
	env := e.env()
	for i, p := range loaded {
		if !p.env.known() || p.env == env {
			continue
		}
		if p.prof == nil {
			e.cfg.logger.Warn("chameleon: policy planned elsewhere, without its profile: used as it is",
				"file", name, "policy", i, "limit", p.env.Limit, "device", p.env.Device)
			continue
		}
		up, err := e.update(p)
		if err != nil {
			e.cfg.logger.Warn("chameleon: policy not updated to this engine: left out", "file", name, "policy", i, "err", err)
			loaded[i] = nil
			continue
		}
		loaded[i] = up
	}
	for _, p := range loaded {
		if p != nil {
			e.cache.put(p)
		}
	}
	if fc.Last != nil && e.stats.Iterations == 0 && !e.it.active {
		// Applied from the first iteration (Begin).
		e.restart = e.cache.get(*fc.Last)
	}
	return nil
}

// SavePolicyFile writes the policy cache to path without ever leaving a
// partial file there: it writes a temporary file in the same directory,
// syncs it, renames it over path and syncs the directory. A crash at any
// point leaves path as it was or as it is now, never damaged.
func (e *Engine) SavePolicyFile(path string) error {
	if e.isClosed() {
		return ErrClosed
	}
	data, err := e.encodePolicies()
	if err != nil {
		return err
	}
	if err := policyfile.WriteAtomic(path, data, policySaveHooks); err != nil {
		return fmt.Errorf("chameleon: save policy file %s: %w", path, err)
	}
	return nil
}

// policySaveHooks are those of SavePolicyFile: none, in 1 MiB writes (a
// test sets others: SetPolicySaveStep).
var policySaveHooks = policyfile.SaveHooks{Chunk: 1 << 20}

// LoadPolicyFile reads a policy cache written by SavePolicyFile
// (LoadPolicies), after removing the temporaries a killed save left beside
// it (policyfile.CleanStale).
func (e *Engine) LoadPolicyFile(path string) error {
	if e.isClosed() {
		return ErrClosed
	}
	if n := policyfile.CleanStale(path); n > 0 {
		e.cfg.logger.Info("chameleon: removed the temporaries a killed save left", "file", path, "removed", n)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("chameleon: policy file: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > policyfile.MaxFileBytes {
		// Refused unread.
		return fmt.Errorf("chameleon: policy file %s: %d bytes: larger than the %d bytes a policy file may have", path, st.Size(), int64(policyfile.MaxFileBytes))
	}
	return e.LoadPolicies(f, path)
}

// openPolicyFile loads WithPolicyFile's file when New starts: a missing
// file is a first run; a damaged one is reported (Engine.PolicyFileError,
// and a warning to the logger) and the Engine starts without it, or, with
// WithStrictPolicyFile, New fails.
func (e *Engine) openPolicyFile() error {
	path := e.cfg.policyFile
	if path == "" {
		return nil
	}
	err := e.LoadPolicyFile(path)
	switch {
	case err == nil:
		e.cfg.logger.Debug("chameleon: policy file loaded", "file", path, "policies", e.cache.len())
		return nil
	case errors.Is(err, fs.ErrNotExist):
		e.cfg.logger.Debug("chameleon: no policy file yet", "file", path)
		return nil
	case e.cfg.strictPolicy:
		return err
	}
	e.policyErr = err
	e.cfg.logger.Warn("chameleon: policy file not used, starting without it", "file", path, "err", err)
	return nil
}

// PolicyFileError is why the file of WithPolicyFile was not used, when it
// was damaged or foreign (nil otherwise, and when it did not exist).
func (e *Engine) PolicyFileError() error { return e.policyErr }

// env is what this Engine's plans assume.
func (e *Engine) env() policyEnv {
	return policyEnv{Limit: e.cfg.limit, Link: e.cfg.link(), Device: e.dev.Name()}
}

// link is the host link the planning path models.
func (c *config) link() simulate.Link {
	if c.linkSet {
		return simulate.H200().Scaled(c.linkBW)
	}
	return simulate.H200()
}

// CachedPolicies is the number of policies in the cache.
func (e *Engine) CachedPolicies() int { return e.cache.len() }

// isClosed reports whether Close ran.
func (e *Engine) isClosed() bool {
	defer e.rlock()()
	return e.closed
}

// same reports whether two signatures name the same sequence.
func (c *policyCache) same(a, b policyKey) bool { return a.Same(b, c.memDelta) }
