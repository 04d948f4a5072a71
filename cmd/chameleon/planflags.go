package main

import (
	"strings"

	"github.com/samber/lo"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/plan"
)

// planFlags are plan's flags as given; check validates every one of them
// before the trace is read.
type planFlags struct {
	trace                                 traceFlags
	iter, groups, prefetch                int
	limit, bandwidth, estimator, grouping string
	curve, minBytes, tiers, plot, page    string
	plotX                                 string
	boundaries                            string
	hostBudget                            string
	margin                                float64
	recompute, noLayout                   bool
}

func (f planFlags) check() (planConfig, error) {
	if err := f.trace.check(); err != nil {
		return planConfig{}, err
	}
	if err := checkLimit(f.limit); err != nil {
		return planConfig{}, err
	}
	if err := checkIterGroups(f.iter, f.groups); err != nil {
		return planConfig{}, err
	}
	if f.prefetch < 0 {
		return planConfig{}, usagef("--prefetch %d: want 0 or more logical layers", f.prefetch)
	}
	if f.margin < 0 {
		return planConfig{}, usagef("--margin %g: want 0 or more", f.margin)
	}
	rate, err := parseBandwidth(f.bandwidth)
	if err != nil {
		return planConfig{}, usagef("--bandwidth: %v", err)
	}
	e, ok := estimators[f.estimator]
	if !ok {
		return planConfig{}, usagef("--estimator: unknown %q (have %s)", f.estimator, strings.Join(estimatorNames(), ", "))
	}
	mb, err := chameleon.ParseBytes(f.minBytes)
	if err != nil {
		return planConfig{}, usagef("--min-bytes: %v", err)
	}
	var page int64
	if strings.TrimSpace(f.page) != "" {
		if page, err = chameleon.ParseBytes(f.page); err != nil || page <= 0 || page&(page-1) != 0 {
			return planConfig{}, usagef("--page %q: want a power of two with a unit (2MiB)", f.page)
		}
	}
	hb, err := chameleon.ParseBytes(f.hostBudget)
	if err != nil || hb < 0 {
		return planConfig{}, usagef("--host-budget %q: want bytes with a unit (64GiB), or 0 for none", f.hostBudget)
	}
	var tierList []int
	if strings.TrimSpace(f.tiers) != "" {
		if tierList, err = chameleon.ParseTiers(f.tiers); err != nil {
			return planConfig{}, usagef("--tiers: %v", err)
		}
	}
	if f.plot != "" {
		if _, err := plotFormat(f.plot); err != nil {
			return planConfig{}, usagef("--plot %v", err)
		}
	}
	switch f.plotX {
	case "", "op", "time":
	default:
		return planConfig{}, usagef("--plot-x %q: want op or time", f.plotX)
	}
	if f.plotX == "time" && f.plot == "" {
		return planConfig{}, usagef("--plot-x time sets --plot's axis: it needs --plot")
	}
	cfg := planConfig{iter: f.iter, limit: f.limit, bandwidth: rate, estimator: e, groups: f.groups, grouping: f.grouping,
		minBytes: mb, prefetch: f.prefetch, margin: f.margin, curve: f.curve, tiers: tierList, recompute: f.recompute, noLayout: f.noLayout, page: page,
		timeBase: lo.Ternary(f.estimator == "recorded", layer.BaseRecorded, layer.BaseEstimated), plotTime: f.plotX == "time", hostBudget: hb}
	if f.boundaries != "" {
		if cfg.grouper, err = plan.ParseBoundaries(f.boundaries); err != nil {
			return planConfig{}, usagef("--boundaries: %v", err)
		}
	}
	opts, err := cfg.planOptions()
	if err != nil {
		return planConfig{}, usageError{err}
	}
	if err := plan.Validate(opts...); err != nil {
		return planConfig{}, usageError{err}
	}
	return cfg, nil
}
