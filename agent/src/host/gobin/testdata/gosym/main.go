// An independent oracle for the gobin tests: the functions Go's own debug/gosym finds in a
// (stripped) binary's .gopclntab (or .data.rel.ro.gopclntab). Prints "entry end name" in hex
// for each exact name given.
package main

import (
	"debug/elf"
	"debug/gosym"
	"fmt"
	"os"
)

func main() {
	f, err := elf.Open(os.Args[1])
	if err != nil {
		panic(err)
	}
	section := f.Section(".gopclntab")
	if section == nil {
		section = f.Section(".data.rel.ro.gopclntab")
	}
	data, err := section.Data()
	if err != nil {
		panic(err)
	}
	table, err := gosym.NewTable(nil, gosym.NewLineTable(data, f.Section(".text").Addr))
	if err != nil {
		panic(err)
	}
	for _, name := range os.Args[2:] {
		if fn := table.LookupFunc(name); fn != nil {
			fmt.Printf("%x %x %s\n", fn.Entry, fn.End, fn.Name)
		}
	}
}
