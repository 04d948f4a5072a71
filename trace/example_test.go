package trace_test

import (
	"fmt"

	"github.com/chameleon-go/chameleon/trace"
)

func ExampleReadFile() {
	tr, err := trace.ReadFile("../testdata/llama4-small.jsonl.gz")
	if err != nil {
		fmt.Println(err)
		return
	}
	it := tr.Iterations[0]
	fmt.Println(tr.Header.Model, len(tr.Iterations), "iterations")
	fmt.Println(len(it.Ops), "ops; first", it.Ops[0].Name, it.Ops[0].Phase)
	fmt.Printf("peak %.2f GiB\n", float64(it.PeakBytes)/(1<<30))
	// Output:
	// llama-small 3 iterations
	// 994 ops; first aten::embedding fwd
	// peak 1.23 GiB
}
