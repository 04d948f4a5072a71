// Command embed is the smallest program that embeds the Engine: a pure-Go
// host device, an Engine under a memory limit smaller than one step's
// activations, and a training-shaped loop (a forward that saves an
// activation per layer, a backward that reads them in reverse), run for a
// few steps. The Engine swaps the saved activations out and back, plans a
// policy once the sequence is stable, and every byte read back is the byte
// written.
//
//	go run ./examples/embed
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/trace"
)

func main() {
	if err := run(os.Stdout, 12); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

const (
	layers   = 8
	actBytes = 64 << 10 // one saved activation
	limit    = 320 << 10
)

// run trains for steps steps and reports what the Engine did; opts go to
// the Engine after the limit.
func run(out io.Writer, steps int, opts ...chameleon.Option) error {
	dev, err := host.New(limit) // or cuda.New() on an NVIDIA GPU
	if err != nil {
		return err
	}
	defer dev.Close()
	eng, err := chameleon.New(dev, append([]chameleon.Option{chameleon.WithMemoryLimit(limit)}, opts...)...)
	if err != nil {
		return err
	}
	defer eng.Close()

	// A parameter: persistent, lives across steps.
	w, err := eng.NewTensor(16<<10, chameleon.Persistent, "uint8", []int64{16 << 10})
	if err != nil {
		return err
	}
	defer eng.Release(w)

	// kernel fills t with a byte that names the layer and step; check reads
	// it back. Kernels run on the Engine's compute stream, after the waits
	// it queued there, and resolve Ptr inside the op that lists the tensor.
	kernel := func(t *chameleon.Tensor, v byte) {
		ptr, n := t.Ptr(), t.Size()
		dev.Launch(eng.ComputeStream(), func() {
			b := dev.Bytes(ptr, n)
			for i := range b {
				b[i] = v
			}
		})
	}
	check := func(t *chameleon.Tensor, v byte) error {
		got := make([]byte, t.Size())
		if err := dev.ReadDevice(got, t.Ptr()); err != nil {
			return err
		}
		for i, b := range got {
			if b != v {
				return fmt.Errorf("tensor %d byte %d: %d, want %d", t.ID(), i, b, v)
			}
		}
		return nil
	}

	var hits, plans int
	for step := range steps {
		it := eng.Begin()
		saved := make([]*chameleon.Tensor, layers)
		for l := range layers { // forward: each layer saves its output
			out, err := eng.NewTensor(actBytes, chameleon.Activation, "uint8", []int64{actBytes})
			if err != nil {
				return err
			}
			in := []*chameleon.Tensor{w}
			if l > 0 {
				in = append(in, saved[l-1])
			}
			op := chameleon.Op{Name: "aten::mm", Module: fmt.Sprintf("model.layers.%d", l), Phase: trace.PhaseForward,
				In: in, Out: []*chameleon.Tensor{out}}
			if err := it.Before(&op); err != nil {
				return err
			}
			kernel(out, byte(step*layers+l))
			if err := it.After(&op); err != nil {
				return err
			}
			saved[l] = out
		}
		for l := layers - 1; l >= 0; l-- { // backward: reads them in reverse
			op := chameleon.Op{Name: "aten::mm_backward", Module: fmt.Sprintf("model.layers.%d", l), Phase: trace.PhaseBackward,
				In: []*chameleon.Tensor{w, saved[l]}}
			if err := it.Before(&op); err != nil {
				return err
			}
			if err := check(saved[l], byte(step*layers+l)); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			if err := it.After(&op); err != nil {
				return err
			}
			if err := eng.Release(saved[l]); err != nil { // after its last use
				return err
			}
		}
		res := it.End()
		if res.Err != nil {
			return res.Err
		}
		if res.Planned {
			plans++
		}
		if res.CacheHit {
			hits++
		}
		fmt.Fprintf(out, "step %2d  %-10s  planned swaps out %d, in %d; forced evictions %d, on-demand swap-ins %d\n",
			step, res.Stage, res.SwapsOut, res.SwapsIn, res.Evictions, res.OnDemand)
	}
	st := eng.Stats()
	fmt.Fprintf(out, "saved activations %d KiB per step under a %d KiB limit; peak %d KiB\n", layers*actBytes>>10, limit>>10, st.PeakDeviceBytes>>10)
	fmt.Fprintf(out, "swapped %d KiB out, %d KiB in; %d policies planned, %d cache hits; every byte read back intact\n",
		st.SwappedOutBytes>>10, st.SwappedInBytes>>10, plans, hits)
	return nil
}
