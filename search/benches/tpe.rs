//! TPE against random search on the standard test functions: the median,
//! over 20 seeds, of the best value found in 100 trials.
//!
//! `cargo bench -p nestor-search --bench tpe`

use search::benchmarks::{all, median_best};
use search::{BasicVariantGenerator, Mode, Searcher, Tpe, TpeOptions};

fn main() {
    let (seeds, trials) = (20u64, 100usize);
    println!("median best of {trials} trials over {seeds} seeds (lower is better)");
    println!("{:<12} {:>10} {:>12} {:>14} {:>10}", "function", "random", "tpe", "tpe (multi)", "minimum");
    for f in all() {
        let random = median_best(|space, s| Box::new(BasicVariantGenerator::new(space, trials as u64, s)), &f, seeds, trials);
        let tpe = |multivariate: bool| {
            let opts = TpeOptions { multivariate, ..Default::default() };
            median_best(|space, s| Box::new(Tpe::new(space, "y", Mode::Min, s, opts.clone())) as Box<dyn Searcher>, &f, seeds, trials)
        };
        let started = std::time::Instant::now();
        let (uni, multi) = (tpe(false), tpe(true));
        let secs = started.elapsed().as_secs_f64();
        println!("{:<12} {:>10.4} {:>12.4} {:>14.4} {:>10.4}   ({secs:.2} s for the TPE runs)", f.name, random, uni, multi, f.minimum);
    }
}
