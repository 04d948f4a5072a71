package mre

import (
	"fmt"

	"github.com/chameleon-go/chameleon/simulate"
)

// Option configures Plan.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	minBytes    int64
	c           float64
	prefetch    int
	margin      float64
	link        simulate.Link
	rounds      int
	sim         func(simulate.Input) (*simulate.Result, error)
	noRetime    bool
	noWriteBack bool
}

// Defaults.
const (
	DefaultMinBytes       = 1 << 20
	DefaultC              = 0.7
	DefaultPrefetchLayers = 2
	DefaultRounds         = 8
)

func newConfig(opts []Option) config {
	c := config{
		minBytes: DefaultMinBytes,
		c:        DefaultC,
		prefetch: DefaultPrefetchLayers,
		link:     simulate.H200(),
		rounds:   DefaultRounds,
		sim:      simulate.Run,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

func (c config) validate() error {
	switch {
	case c.minBytes < 0:
		return fmt.Errorf("mre: negative size threshold %d", c.minBytes)
	case c.c < 0:
		return fmt.Errorf("mre: negative score weight C %g", c.c)
	case c.prefetch < 0:
		return fmt.Errorf("mre: negative prefetch layers %d", c.prefetch)
	case c.margin < 0:
		return fmt.Errorf("mre: negative safety margin %g", c.margin)
	case c.rounds < 1:
		return fmt.Errorf("mre: rounds %d < 1", c.rounds)
	case !(c.link.D2H > 0 && c.link.H2D > 0 && c.link.D2HShared > 0 && c.link.H2DShared > 0):
		return fmt.Errorf("mre: link rates must be positive: %+v", c.link)
	}
	return nil
}

// WithMinBytes sets the size under which a tensor is not a candidate
// (default 1 MiB). When the limit cannot be met above it, Plan retries with
// every size.
func WithMinBytes(n int64) Option { return optionFunc(func(c *config) { c.minBytes = n }) }

// WithScoreWeight sets C in the score N_MRE + C*S (default 0.7).
func WithScoreWeight(w float64) Option { return optionFunc(func(c *config) { c.c = w }) }

// WithPrefetchLayers sets how many logical layers ahead of its next use a
// swap-in is triggered at the latest (default 2).
func WithPrefetchLayers(n int) Option { return optionFunc(func(c *config) { c.prefetch = n }) }

// WithSafetyMargin stretches every modeled copy time by 1+m (default 0; 0.15
// suits devices whose copy rate varies more, such as Ascend NPUs).
func WithSafetyMargin(m float64) Option { return optionFunc(func(c *config) { c.margin = m }) }

// WithLink sets the link model (default simulate.H200()).
func WithLink(l simulate.Link) Option { return optionFunc(func(c *config) { c.link = l }) }

// WithSimulator sets the timeline each plan-simulate round checks the
// plan on (default simulate.Run); nil keeps the default.
func WithSimulator(run func(simulate.Input) (*simulate.Result, error)) Option {
	return optionFunc(func(c *config) {
		if run != nil {
			c.sim = run
		}
	})
}

// WithoutRetime leaves the copies of the planned swaps where the selection
// timed them: Plan then does not move the copies that made compute wait
// to where the simulated memory has room (see Plan), and the memory keeps
// the room they would take.
func WithoutRetime() Option { return optionFunc(func(c *config) { c.noRetime = true }) }

// WithoutWriteBack copies every swapped tensor out after its last use
// before the gap, as the selection placed the copy: Plan then issues no
// copy out as a write-back at the tensor's last write (see Plan).
func WithoutWriteBack() Option { return optionFunc(func(c *config) { c.noWriteBack = true }) }

// Validate reports the first setting among opts that Plan would refuse, so
// a caller can check its settings before it has anything to plan.
func Validate(opts ...Option) error { return newConfig(opts).validate() }
