package nccl

import (
	"errors"
	"fmt"
	"strings"

	"github.com/chameleon-go/chameleon/device"
)

// Result is an ncclResult_t. Non-zero values are errors; a call's failure
// is an *Error that wraps its Result, so errors.Is(err, nccl.ErrTimeout)
// (or nccl.Timeout) holds for a timed-out call.
type Result int32

// ncclResult_t codes (nccl.h).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8
)

// Sentinels for the common codes: errors.Is(err, ErrInvalidArgument) holds
// for every *Error of that code.
var (
	ErrUnhandledCuda   error = UnhandledCudaError
	ErrSystem          error = SystemError
	ErrInternal        error = InternalError
	ErrInvalidArgument error = InvalidArgument
	ErrInvalidUsage    error = InvalidUsage
	ErrRemote          error = RemoteError
	ErrInProgress      error = InProgress
	ErrTimeout         error = Timeout
)

var resultNames = [...]string{
	Success:            "ncclSuccess",
	UnhandledCudaError: "ncclUnhandledCudaError",
	SystemError:        "ncclSystemError",
	InternalError:      "ncclInternalError",
	InvalidArgument:    "ncclInvalidArgument",
	InvalidUsage:       "ncclInvalidUsage",
	RemoteError:        "ncclRemoteError",
	InProgress:         "ncclInProgress",
	Timeout:            "ncclTimeout",
}

// Name is the code's name in nccl.h, e.g. "ncclInvalidArgument".
func (r Result) Name() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// Error implements error: the name and the code.
func (r Result) Error() string { return fmt.Sprintf("%s (%d)", r.Name(), int32(r)) }

// Is maps the argument codes to device.ErrInvalidValue.
func (r Result) Is(target error) bool {
	return target == device.ErrInvalidValue && (r == InvalidArgument || r == InvalidUsage)
}

// Error is a failed NCCL call: the call, its code, the library's text for
// the code (ncclGetErrorString) and, where the library has it, its last
// error message (ncclGetLastError), which often names the cause.
type Error struct {
	Call string
	Code Result
	// Text is ncclGetErrorString's text for Code; empty without a library.
	Text string
	// Last is ncclGetLastError's message; empty when the library lacks the
	// call or has no message. NCCL keeps it per process, so it may tell of
	// an earlier failure, or another thread's.
	Last string
}

// Error implements error.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nccl: %s: %s", e.Call, e.Code.Error())
	if e.Text != "" {
		fmt.Fprintf(&b, ": %s", e.Text)
	}
	if e.Last != "" && e.Last != e.Text {
		fmt.Fprintf(&b, " (%s)", e.Last)
	}
	return b.String()
}

// Unwrap returns the code, for errors.Is with a Result or a sentinel.
func (e *Error) Unwrap() error { return e.Code }

// check is nil for ncclSuccess, else an *Error for call. comm (0: none)
// is passed to ncclGetLastError.
func (l *Library) check(call string, rc int32, comm uintptr) error {
	if rc == 0 {
		return nil
	}
	e := &Error{Call: call, Code: Result(rc)}
	if l.getErrorString != nil {
		e.Text = l.getErrorString(rc)
	}
	if l.getLastError != nil {
		e.Last = l.getLastError(comm)
	}
	return e
}

// ErrCommClosed is returned by a Comm's calls after Destroy or Abort.
var ErrCommClosed = errors.New("nccl: communicator destroyed or aborted")
