package driver

import (
	"fmt"
	"runtime"

	"github.com/chameleon-go/chameleon/internal/dl"
)

// NVRTC is one loaded libnvrtc.
type NVRTC struct {
	Path string
	// nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
	//                                int numHeaders, const char * const *headers, const char * const *includeNames);
	create func(prog *uintptr, src, name *byte, numHeaders int32, headers, includeNames **byte) int32
	// nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char * const *options);
	compile func(prog uintptr, numOptions int32, options **byte) int32
	// nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet);
	ptxSize func(prog uintptr, size *uintptr) int32
	// nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
	ptx func(prog uintptr, out *byte) int32
	// nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet);
	logSize func(prog uintptr, size *uintptr) int32
	// nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
	log func(prog uintptr, out *byte) int32
	// nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
	destroy func(prog *uintptr) int32
	// const char *nvrtcGetErrorString(nvrtcResult result);
	errorString func(code int32) string
}

// LoadNVRTC opens the first of paths that loads (Candidates(EnvNVRTC,
// NVRTCNames...) when paths is empty) and binds it.
func LoadNVRTC(paths ...string) (*NVRTC, error) {
	if len(paths) == 0 {
		paths = Candidates(EnvNVRTC, NVRTCNames...)
	}
	lib, err := Open(paths)
	if err != nil {
		return nil, fmt.Errorf("nvrtc: %w", err)
	}
	n := &NVRTC{Path: lib.Path}
	if err := Bind(lib,
		dl.Func{Ptr: &n.create, Name: "nvrtcCreateProgram"},
		dl.Func{Ptr: &n.compile, Name: "nvrtcCompileProgram"},
		dl.Func{Ptr: &n.ptxSize, Name: "nvrtcGetPTXSize"},
		dl.Func{Ptr: &n.ptx, Name: "nvrtcGetPTX"},
		dl.Func{Ptr: &n.logSize, Name: "nvrtcGetProgramLogSize"},
		dl.Func{Ptr: &n.log, Name: "nvrtcGetProgramLog"},
		dl.Func{Ptr: &n.destroy, Name: "nvrtcDestroyProgram"},
		dl.Func{Ptr: &n.errorString, Name: "nvrtcGetErrorString"},
	); err != nil {
		return nil, fmt.Errorf("nvrtc: %w", err)
	}
	return n, nil
}

func (n *NVRTC) check(what string, rc int32) error {
	if rc == 0 {
		return nil
	}
	return fmt.Errorf("nvrtc: %s: %s (%d)", what, n.errorString(rc), rc)
}

// Compile compiles CUDA C source to PTX (NUL-terminated, ready for
// LoadModule). The compile log is in the error when it fails.
func (n *NVRTC) Compile(src, name string, options ...string) ([]byte, error) {
	csrc, cname := dl.CString(src), dl.CString(name)
	var prog uintptr
	if err := n.check("create program", n.create(&prog, &csrc[0], &cname[0], 0, nil, nil)); err != nil {
		return nil, err
	}
	defer n.destroy(&prog)
	// The option array holds Go pointers that C reads: pin what they
	// point at for the call.
	var pin runtime.Pinner
	defer pin.Unpin()
	opts := make([][]byte, len(options))
	ptrs := make([]*byte, len(options)+1)
	for i, o := range options {
		opts[i] = dl.CString(o)
		pin.Pin(&opts[i][0])
		ptrs[i] = &opts[i][0]
	}
	if rc := n.compile(prog, int32(len(options)), &ptrs[0]); rc != 0 {
		var size uintptr
		msg := ""
		if n.logSize(prog, &size) == 0 && size > 1 {
			buf := make([]byte, size)
			if n.log(prog, &buf[0]) == 0 {
				msg = ": " + string(buf[:size-1])
			}
		}
		return nil, fmt.Errorf("%w%s", n.check("compile "+name, rc), msg)
	}
	var size uintptr
	if err := n.check("ptx size", n.ptxSize(prog, &size)); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, fmt.Errorf("nvrtc: compile %s: empty PTX", name)
	}
	ptx := make([]byte, size)
	if err := n.check("get ptx", n.ptx(prog, &ptx[0])); err != nil {
		return nil, err
	}
	if ptx[len(ptx)-1] != 0 {
		ptx = append(ptx, 0)
	}
	return ptx, nil
}
