package pytorch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/chameleon-go/chameleon/trace"
)

// cpuOp is one Kineto CPU-side record (cat cpu_op or user_annotation).
type cpuOp struct {
	name    string
	ts, dur float64 // µs
	ext     int64
	rf      int64
}

// gpuEvent is one kernel, copy or memset on the device timeline.
type gpuEvent struct {
	ts, dur float64
	ext     int64 // External id of the CPU op that launched it, -1 when unknown
	corr    int64 // correlation id of the launch, -1 when unknown
}

// memEvent is one "[memory]" instant event of the allocator.
type memEvent struct {
	ts        float64
	total     int64 // "Total Allocated" after the event
	bytes     int64 // + allocated, - freed
	addr      uint64
	devType   int64
	devID     int64
	hasDevice bool
}

// kinetoDoc is what the importer keeps of a Kineto Chrome trace.
type kinetoDoc struct {
	ops        []cpuOp
	rfSeen     bool // some event carried "Record function id"
	gpu        []gpuEvent
	corrExt    map[int64]int64 // launch correlation id -> External id
	mem        []memEvent
	steps      []cpuOp // ProfilerStep#N
	deviceName string
	strs       interner
}

type rawEvent struct {
	Ph   string          `json:"ph"`
	Cat  string          `json:"cat"`
	Name string          `json:"name"`
	Ts   json.RawMessage `json:"ts"`
	Dur  json.RawMessage `json:"dur"`
	Args json.RawMessage `json:"args"`
}

type rawArgs struct {
	ExtID   json.RawMessage `json:"External id"`
	RFID    json.RawMessage `json:"Record function id"`
	Corr    json.RawMessage `json:"correlation"`
	Total   json.RawMessage `json:"Total Allocated"`
	Bytes   json.RawMessage `json:"Bytes"`
	Addr    json.RawMessage `json:"Addr"`
	DevType json.RawMessage `json:"Device Type"`
	DevID   json.RawMessage `json:"Device Id"`
}

// readKineto decodes a Kineto (Chrome trace) JSON one event at a time,
// within the limits of the package.
func readKineto(r io.Reader, name string) (*kinetoDoc, error) {
	dec := newDecoder(r)
	if err := expectDelim(dec, '{', name, ""); err != nil {
		return nil, err
	}
	doc := &kinetoDoc{corrExt: make(map[int64]int64)}
	sawEvents := false
	for dec.More() {
		key, err := objectKey(dec, name, "")
		if err != nil {
			return nil, err
		}
		switch key {
		case "traceEvents":
			sawEvents = true
			if err := expectDelim(dec, '[', name, "traceEvents"); err != nil {
				return nil, err
			}
			for i := 0; dec.More(); i++ {
				where := fmt.Sprintf("traceEvents[%d]", i)
				if i >= MaxEvents {
					return nil, &ParseError{File: name, Where: where, Err: fmt.Errorf("more than %d events", MaxEvents)}
				}
				var ev rawEvent
				if err := dec.Decode(&ev); err != nil {
					return nil, decodeErr(name, where, err)
				}
				if err := doc.add(&ev, name, where); err != nil {
					return nil, err
				}
			}
			if err := expectDelim(dec, ']', name, "traceEvents"); err != nil {
				return nil, err
			}
		case "deviceProperties":
			if err := doc.deviceProperties(dec, name); err != nil {
				return nil, err
			}
		default:
			if err := skipValue(dec, name, key); err != nil {
				return nil, err
			}
		}
	}
	if err := expectDelim(dec, '}', name, ""); err != nil {
		return nil, err
	}
	if err := expectEnd(dec, name); err != nil {
		return nil, err
	}
	if !sawEvents {
		return nil, &ParseError{File: name, Field: "traceEvents", Err: errors.New("missing: not a Kineto/Chrome trace")}
	}
	slices.SortStableFunc(doc.mem, func(a, b memEvent) int {
		switch {
		case a.ts < b.ts:
			return -1
		case a.ts > b.ts:
			return 1
		}
		return 0
	})
	return doc, nil
}

// deviceProperties reads the list of devices one at a time and keeps the
// name of the first.
func (d *kinetoDoc) deviceProperties(dec *decoder, file string) error {
	tok, err := dec.Token()
	if err != nil {
		return readErr(file, "deviceProperties", err)
	}
	switch tok {
	case nil:
		return nil
	case json.Delim('['):
	default:
		return &ParseError{File: file, Where: "deviceProperties", Err: fmt.Errorf("want a list, got %v", tok)}
	}
	for i := 0; dec.More(); i++ {
		if i >= MaxListLen {
			return &ParseError{File: file, Where: "deviceProperties", Err: fmt.Errorf("more than %d devices", MaxListLen)}
		}
		var p struct {
			Name string `json:"name"`
		}
		if err := dec.Decode(&p); err != nil {
			return decodeErr(file, fmt.Sprintf("deviceProperties[%d]", i), err)
		}
		if i == 0 {
			if d.deviceName, err = d.strs.get(p.Name); err != nil {
				return &ParseError{File: file, Where: "deviceProperties[0]", Field: "name", Err: err}
			}
		}
	}
	return expectDelim(dec, ']', file, "deviceProperties")
}

func (d *kinetoDoc) add(ev *rawEvent, file, where string) error {
	cat := strings.ToLower(ev.Cat)
	isMem := ev.Name == "[memory]"
	var kind int
	switch {
	case isMem:
		kind = 1
	case ev.Ph == "X" && (cat == "cpu_op" || cat == "operator" || cat == "user_annotation"):
		kind = 2
	case ev.Ph == "X" && (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset" || cat == "memcpy" || cat == "memset"):
		kind = 3
	case ev.Ph == "X" && (cat == "cuda_runtime" || cat == "cuda_driver" || cat == "runtime"):
		kind = 4
	default:
		return nil
	}
	bad := func(field string, err error) error {
		return &ParseError{File: file, Where: where, Field: field, Err: err}
	}
	var a rawArgs
	if len(ev.Args) > 0 && string(ev.Args) != "null" {
		if err := json.Unmarshal(ev.Args, &a); err != nil {
			return bad("args", fmt.Errorf("want an object: %v", err))
		}
	}
	optInt := func(field string, raw json.RawMessage, def int64) (int64, error) {
		if len(raw) == 0 || string(raw) == "null" {
			return def, nil
		}
		v, err := parseInt(raw)
		if err != nil {
			return 0, bad(field, err)
		}
		return v, nil
	}
	ts, err := parseFloat(ev.Ts)
	if err != nil {
		return bad("ts", err)
	}
	if ts < -MaxTimestampUS || ts > MaxTimestampUS {
		return bad("ts", fmt.Errorf("%g µs, more than 2^53 µs (285 years) from zero", ts))
	}
	var dur float64
	if kind != 1 {
		if dur, err = parseFloat(ev.Dur); err != nil {
			return bad("dur", err)
		}
		if err := checkTime(dur, MaxEventUS, "a day"); err != nil {
			return bad("dur", err)
		}
	}
	switch kind {
	case 1:
		m := memEvent{ts: ts}
		if len(a.Total) == 0 {
			return bad("args.Total Allocated", errors.New("missing"))
		}
		if m.total, err = optInt("args.Total Allocated", a.Total, 0); err != nil {
			return err
		}
		if m.total < 0 || m.total > trace.MaxBytes {
			return bad("args.Total Allocated", fmt.Errorf("%d outside [0, %d]", m.total, int64(trace.MaxBytes)))
		}
		if m.bytes, err = optInt("args.Bytes", a.Bytes, 0); err != nil {
			return err
		}
		addr, err := optInt("args.Addr", a.Addr, 0)
		if err != nil {
			return err
		}
		m.addr = uint64(addr)
		if len(a.DevType) > 0 {
			m.hasDevice = true
			if m.devType, err = optInt("args.Device Type", a.DevType, 0); err != nil {
				return err
			}
			if m.devID, err = optInt("args.Device Id", a.DevID, 0); err != nil {
				return err
			}
		}
		d.mem = append(d.mem, m)
	case 2:
		name, err := d.strs.get(ev.Name)
		if err != nil {
			return bad("name", err)
		}
		op := cpuOp{name: name, ts: ts, dur: dur}
		if op.ext, err = optInt("args.External id", a.ExtID, -1); err != nil {
			return err
		}
		if op.rf, err = optInt("args.Record function id", a.RFID, -1); err != nil {
			return err
		}
		if len(a.RFID) > 0 {
			d.rfSeen = true
		}
		if strings.HasPrefix(ev.Name, "ProfilerStep#") {
			d.steps = append(d.steps, op)
		}
		d.ops = append(d.ops, op)
	case 3:
		g := gpuEvent{ts: ts, dur: dur}
		if g.ext, err = optInt("args.External id", a.ExtID, -1); err != nil {
			return err
		}
		if g.corr, err = optInt("args.correlation", a.Corr, -1); err != nil {
			return err
		}
		d.gpu = append(d.gpu, g)
	case 4:
		ext, err := optInt("args.External id", a.ExtID, -1)
		if err != nil {
			return err
		}
		corr, err := optInt("args.correlation", a.Corr, -1)
		if err != nil {
			return err
		}
		if ext >= 0 && corr >= 0 {
			d.corrExt[corr] = ext
		}
	}
	return nil
}

// parseFloat reads a JSON number, or a number written as a string.
func parseFloat(raw json.RawMessage) (float64, error) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || s == "null" {
		return 0, errors.New("missing")
	}
	if s[0] == '"' {
		s = strings.Trim(s, `"`)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != f || f > 1e300 || f < -1e300 {
		return 0, fmt.Errorf("want a number, got %.40s", s)
	}
	return f, nil
}
