package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda/nccl"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/examples/internal/backend"
)

// job is what the command's runs train on: one device, or with --ranks
// (or --rank-channel) one device per data-parallel rank, the policy
// channel they exchange policies over and the all-reduce of their
// gradients.
type job struct {
	o        *options
	ranked   bool
	n        int // ranks (1 when not ranked)
	channel  string
	backends []*backend.Backend
	// cuda: the library and the gradients' communicators, one per rank.
	lib   *nccl.Library
	grads []*nccl.Comm
}

// onThread runs fn on a goroutine locked to an OS thread that ends with
// it: the CUDA runtime keeps the current GPU per thread, and a thread that
// made GPU r current must not run another GPU's calls later.
func onThread(fn func()) {
	var wg sync.WaitGroup
	wg.Go(func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		fn()
	})
	wg.Wait()
}

// rankChannel is the policy channel the options ask for: "" when the
// command runs no ranks.
func rankChannel(o *options) string {
	switch {
	case o.rankChannel != "":
		return o.rankChannel
	case o.ranks <= 1:
		return ""
	case o.device == "cuda":
		return "nccl"
	}
	return "local"
}

// openJob opens the devices: rank r on GPU r with --device cuda, on a
// host device of its own with --device host.
func openJob(o *options, page int64) (j *job, err error) {
	j = &job{o: o, channel: rankChannel(o), n: 1}
	j.ranked = j.channel != ""
	if j.ranked {
		j.n = o.ranks
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, j.Close())
			j = nil
		}
	}()
	j.backends = make([]*backend.Backend, j.n)
	for r := range j.backends {
		bo := backend.Options{Device: o.device, Workers: o.workers, HostBW: o.hostBW, TF32: o.tf32, Arch: o.arch, PageSize: page, Ordinal: r}
		if j.ranked {
			onThread(func() { j.backends[r], err = backend.Open(bo) })
		} else {
			j.backends[r], err = backend.Open(bo)
		}
		if err != nil {
			if j.ranked {
				err = fmt.Errorf("rank %d: %w", r, err)
			}
			return j, err
		}
	}
	if !j.ranked || o.device != "cuda" || (j.n == 1 && j.channel == "local") {
		return j, nil // one GPU and no NCCL channel: nothing to average
	}
	if j.lib, err = nccl.Open(); err != nil {
		return j, fmt.Errorf("--ranks on cuda average the gradients with NCCL: %w", err)
	}
	v, err := j.lib.Version()
	if err != nil {
		return j, err
	}
	if v.Major() < 2 || (v.Major() == 2 && v.Minor() < 10) {
		return j, fmt.Errorf("NCCL %s at %s: the gradients' average (ncclAvg) needs 2.10 or later", v, j.lib.Path())
	}
	onThread(func() { j.grads, err = j.lib.InitAll(j.ordinals()...) })
	if err != nil {
		return j, fmt.Errorf("the gradients' NCCL communicators: %w", err)
	}
	return j, nil
}

func (j *job) ordinals() []int {
	ords := make([]int, j.n)
	for r := range ords {
		ords[r] = r
	}
	return ords
}

// Close closes the communicators and the devices.
func (j *job) Close() error {
	var errs []error
	for _, c := range j.grads {
		errs = append(errs, c.Destroy())
	}
	for _, b := range j.backends {
		switch {
		case b == nil:
		case j.ranked:
			errs = append(errs, onDevice(b.Dev, b.Close))
		default:
			errs = append(errs, b.Close())
		}
	}
	return errors.Join(errs...)
}

// free is the device memory free at start on the fullest device (0:
// unbounded).
func (j *job) free() int64 {
	var f int64
	for _, b := range j.backends {
		if b.Free > 0 && (f == 0 || b.Free < f) {
			f = b.Free
		}
	}
	return f
}

// closer is an end of a policy channel.
type closer interface{ Close() error }

// channels makes the ends of a fresh policy channel, one per rank: each
// run exchanges over its own, so that nothing one run's Engines left in
// it reaches the next run's.
func (j *job) channels() ([]chameleon.PolicyChannel, []closer, error) {
	chs := make([]chameleon.PolicyChannel, j.n)
	cls := make([]closer, j.n)
	if j.channel == "local" {
		for r, e := range chameleon.NewLocalChannel(j.n) {
			chs[r], cls[r] = e, e
		}
		return chs, cls, nil
	}
	var comms []*nccl.Comm
	var err error
	onThread(func() { comms, err = j.lib.InitAll(j.ordinals()...) })
	if err != nil {
		return nil, nil, fmt.Errorf("the policy channel's NCCL communicators: %w", err)
	}
	// Every rank makes its end at once: the first exchange connects them.
	ctx, cancel := context.WithTimeout(context.Background(), j.o.rankTimeout)
	defer cancel()
	ends := make([]*nccl.Channel, j.n)
	errs := make([]error, j.n)
	var wg sync.WaitGroup
	for r := range ends {
		wg.Go(func() {
			errs[r] = onDevice(j.backends[r].Dev, func() (err error) {
				ends[r], err = nccl.NewChannel(ctx, comms[r], j.backends[r].Dev)
				return err
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, e := range ends {
			if e != nil {
				e.Close()
			}
		}
		return nil, nil, fmt.Errorf("the NCCL policy channel: %w", err)
	}
	for r, e := range ends {
		chs[r], cls[r] = e, e
	}
	return chs, cls, nil
}

// train runs cfg on every rank (cfg.Batch is one rank's), or on the one
// device; it returns a report per rank.
func (j *job) train(cfg Config) (reps []*Report, err error) {
	if !j.ranked {
		b := j.backends[0]
		rep, err := Train(b.Dev, b.Kernels, cfg)
		return []*Report{rep}, err
	}
	chs, cls, err := j.channels()
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range cls {
			err = errors.Join(err, c.Close())
		}
	}()
	ranks := make([]Rank, j.n)
	var hosts *hostGroup
	if j.o.device == "host" {
		hosts = newHostGroup(j.n)
	}
	for r := range ranks {
		b := j.backends[r]
		ranks[r] = Rank{Dev: b.Dev, Kernels: b.Kernels,
			Options: []chameleon.Option{chameleon.WithRank(r, j.n, chs[r]), chameleon.WithRankTimeout(j.o.rankTimeout)}}
		if hosts != nil {
			d, ok := b.Dev.(*host.Device)
			if !ok {
				return nil, fmt.Errorf("rank %d: %T is not a host device", r, b.Dev)
			}
			ranks[r].Reduce = hosts.reducer(r, d)
		} else if j.grads == nil {
			ranks[r].Reduce = func(device.Stream) (Reducer, error) { return oneRank{}, nil }
		} else {
			comm := j.grads[r]
			ranks[r].Reduce = func(s device.Stream) (Reducer, error) { return &ncclReducer{comm: comm, s: s}, nil }
		}
	}
	abort := func() {
		if hosts != nil {
			hosts.abort()
		}
		for _, c := range cls {
			c.Close()
		}
		// A rank waiting in an all-reduce for a rank that failed never
		// sees it come: aborting the communicators ends those
		// collectives (and leaves the communicators unusable).
		for _, c := range j.grads {
			c.Abort()
		}
	}
	return TrainRanks(ranks, cfg, abort)
}

// single runs cfg on rank 0's device alone, with cfg.Batch the global
// batch: the run the ranks are checked against.
func (j *job) single(cfg Config) (*Report, error) {
	b := j.backends[0]
	var rep *Report
	err := onDevice(b.Dev, func() (err error) {
		rep, err = Train(b.Dev, b.Kernels, cfg)
		return err
	})
	return rep, err
}
