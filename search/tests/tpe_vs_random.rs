//! TPE finds better values than random search with the same budget: the
//! median over 20 seeds of the best of 100 trials, on Branin, Hartmann-6 and
//! a 10-dimensional mixed function (the figures: `cargo bench --bench tpe`).

use search::benchmarks::{all, median_best};
use search::{BasicVariantGenerator, Mode, Tpe, TpeOptions};

#[test]
fn tpe_beats_random_search_on_every_test_function() {
    for f in all() {
        let random = median_best(|space, s| Box::new(BasicVariantGenerator::new(space, 100, s)), &f, 20, 100);
        let tpe = median_best(|space, s| Box::new(Tpe::new(space, "y", Mode::Min, s, TpeOptions::default())), &f, 20, 100);
        // Closer to the minimum by a clear margin, not by noise.
        let (gap_random, gap_tpe) = (random - f.minimum, tpe - f.minimum);
        assert!(gap_tpe < 0.75 * gap_random, "{}: tpe {tpe} vs random {random} (minimum {})", f.name, f.minimum);
    }
}
