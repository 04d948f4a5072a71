package trace

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// FormatKernels is the format string of a kernel-times file.
const FormatKernels = "optrace-kernels/v1"

// Kernels holds each op's GPU kernel time for one iteration, measured by a
// profiler without syncs between ops: on a GPU-bound run it is the real
// timeline, where the per-op durations of an optrace carry a sync floor.
type Kernels struct {
	Model         string
	SeqLen        int
	IterationMS   float64
	KernelMSTotal float64
	Ops           []KernelOp
}

// KernelOp is one op's kernel time.
type KernelOp struct {
	Seq      int     `json:"seq"`
	Name     string  `json:"name"`
	Overload string  `json:"overload"`
	KernelUS float64 `json:"kernel_us"`
}

// ReadKernelsFile reads an optrace-kernels/v1 file, gzip or plain.
func ReadKernelsFile(path string) (*Kernels, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadKernels(f, filepath.Base(path))
}

// ReadKernels reads an optrace-kernels/v1 document from r.
func ReadKernels(r io.Reader, name string) (*Kernels, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("%s: gzip: %w", name, err)
		}
		if data, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("%s: gzip: %w", name, err)
		}
	}
	var doc struct {
		Format        string     `json:"format"`
		Model         string     `json:"model"`
		SeqLen        int        `json:"seq_len"`
		IterationMS   float64    `json:"iteration_ms"`
		KernelMSTotal float64    `json:"kernel_ms_total"`
		Ops           []KernelOp `json:"ops"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, &ParseError{File: name, Line: 1, Err: err}
	}
	if doc.Format != FormatKernels {
		return nil, &ParseError{File: name, Line: 1, Field: "format", Err: fmt.Errorf("unsupported format %q", doc.Format)}
	}
	for i, op := range doc.Ops {
		if op.Seq != i {
			return nil, &ParseError{File: name, Line: 1, Field: fmt.Sprintf("ops[%d].seq", i), Err: fmt.Errorf("got %d", op.Seq)}
		}
		if op.KernelUS < 0 {
			return nil, &ParseError{File: name, Line: 1, Field: fmt.Sprintf("ops[%d].kernel_us", i), Err: fmt.Errorf("negative %g", op.KernelUS)}
		}
	}
	return &Kernels{Model: doc.Model, SeqLen: doc.SeqLen, IterationMS: doc.IterationMS, KernelMSTotal: doc.KernelMSTotal, Ops: doc.Ops}, nil
}
