package nccl_test

import (
	"context"
	"errors"
	"log"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/device/cuda/nccl"
)

// One process drives two GPUs, one Engine each: a communicator set of its
// own for the policy channel, one end per rank, each handed to that rank's
// Engine with chameleon.WithRank(rank, 2, chs[rank]).
func Example() {
	lib, err := nccl.Open()
	if err != nil {
		log.Fatal(err) // names every place tried
	}
	devs := make([]*cuda.Device, 2)
	for r := range devs {
		if devs[r], err = cuda.New(cuda.WithDevice(r)); err != nil {
			log.Fatal(err)
		}
	}
	comms, err := lib.InitAll(0, 1) // the channel's own communicators
	if err != nil {
		log.Fatal(err)
	}
	chs := make([]*nccl.Channel, 2)
	errs := make([]error, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for r := range chs {
		// Every rank makes its end at once: the first exchange connects them.
		wg.Go(func() { chs[r], errs[r] = nccl.NewChannel(ctx, comms[r], devs[r]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		log.Fatal(err)
	}
	for _, ch := range chs {
		defer ch.Close()
	}
	// Rank r's Engine, from the goroutine that drives GPU r:
	//
	//	chameleon.New(devs[r], chameleon.WithRank(r, 2, chs[r]), chameleon.WithRankTimeout(time.Minute))
}
