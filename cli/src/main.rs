//! The `nestor` binary: `tuner::cli` with data sets (nestor-data's planner).

// The driver allocates per result (metrics maps, store records); mimalloc
// is markedly cheaper at that than the system allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tuner::return_freed_memory_at_once();
    data::install();
    tuner::cli::main()
}
