//! SkyPilot compatibility: the 44 real task files in `../shared/compat`.
//!
//! Every file must either plan against SkyPilot's published catalogs, be
//! refused as "not supported yet: <feature>" with file and line, or find no
//! offering for a reason that the catalogs really imply. The table below
//! says which, file by file, so a regression in any one is caught.

use std::path::PathBuf;

use crate::common::{gangway, parts, shared};

enum Expect {
    /// Parses and gets a non-empty plan.
    Plan,
    /// Refused: "not supported yet: ..." containing this.
    Unsupported(&'static str),
    /// Parses, but those catalogs have no such offering; exit 3 with this reason.
    NoOffer(&'static str),
}

use Expect::*;

const CORPUS: &[(&str, Expect)] = &[
    ("examples__airflow__train.yaml", Plan),
    ("examples__autoresearch__experiment.yaml", Plan),
    (
        "examples__aws_efa__nccl_efa.yaml",
        NoOffer("not on kubernetes"),
    ),
    (
        "examples__chain_dag__2_jobs.yaml",
        Unsupported("multi-document pipelines"),
    ),
    (
        "examples__cosmos3-finetuning__cosmos3_nano_finetune.yaml",
        Plan,
    ),
    ("examples__deepspeed-multinode__sky.yaml", Plan),
    ("examples__distributed-pytorch__train-rdzv.yaml", Plan),
    ("examples__distributed-pytorch__train.yaml", Plan),
    ("examples__distributed_nccl_test_with_mpi.yaml", Plan),
    ("examples__distributed_ray_train__ray_train.yaml", Plan),
    (
        "examples__elastic_training__job.yaml",
        Unsupported("multi-document pipelines"),
    ),
    // K80 is retired from every catalog in ../shared.
    (
        "examples__job_queue__job_multinode.yaml",
        NoOffer("no offering of accelerator 'K80'"),
    ),
    ("examples__managed_job.yaml", Plan),
    // The AWS catalog in ../shared is a GPU-only subset: no CPU types.
    (
        "examples__managed_job_with_storage.yaml",
        NoOffer("a CPU-only instance is offered only on"),
    ),
    ("examples__multi_hostname.yaml", Plan),
    ("examples__resnet_distributed_torch.yaml", Plan),
    (
        "examples__serve__http_server__task.yaml",
        Unsupported("service"),
    ),
    (
        "examples__serve__multi_node__multi_node.yaml",
        Unsupported("service"),
    ),
    (
        "examples__serve__policy__spot_hedge.yaml",
        Unsupported("service"),
    ),
    (
        "examples__serve__spot_policy__multi_accelerators.yaml",
        Unsupported("service"),
    ),
    // V100 on AWS (p3) is not in the AWS subset.
    (
        "examples__spot__bert_qa.yaml",
        NoOffer("V100 is offered only on azure, gcp, lambda, vast; not on aws"),
    ),
    (
        "examples__spot__lightning_cifar10.yaml",
        NoOffer("V100 is offered only on azure, gcp, lambda, vast; not on aws"),
    ),
    (
        "examples__spot__resnet.yaml",
        NoOffer("V100 is offered only on azure, gcp, lambda, vast; not on aws"),
    ),
    ("examples__spot__torchelastic.yaml", Plan),
    // TPUs are not GPUs; their rows are not loaded.
    (
        "examples__tpu__tpuvm_mnist.yaml",
        NoOffer("no offering of accelerator 'tpu-v2-8'"),
    ),
    ("examples__training__torchtitan__torchtitan.yaml", Plan),
    (
        "examples__using_file_mounts.yaml",
        NoOffer("a CPU-only instance is offered only on"),
    ),
    ("llm__axolotl__axolotl-spot.yaml", Plan),
    (
        "llm__deepseek-r1__deepseek-r1-671B.yaml",
        Unsupported("service"),
    ),
    // L40S is in none of the four catalogs in ../shared; the embedded
    // Vast.ai catalog has it.
    ("llm__fairseq2__multinode.sky.yaml", Plan),
    ("llm__gemma4__gemma4.yaml", Unsupported("service")),
    (
        "llm__gpt-2__gpt2-pipeline.yaml",
        Unsupported("multi-document pipelines"),
    ),
    ("llm__gpt-oss-finetuning__gpt-oss-120b-sft.yaml", Plan),
    (
        "llm__gpt-oss__gpt-oss-vllm.sky.yaml",
        Unsupported("service"),
    ),
    ("llm__kimi-k2__kimi-k2.sky.yaml", Unsupported("service")),
    ("llm__llama-3_1-finetuning__lora.yaml", Plan),
    ("llm__llama-3__llama3.yaml", Unsupported("service")),
    ("llm__vicuna__train.yaml", Plan),
    ("llm__vllm__serve.yaml", Plan),
    (
        "tests__test_yamls__test_list_of_dicts_accelerators.yaml",
        Plan,
    ),
    (
        "tests__test_yamls__test_managed_jobs_retry.yaml",
        Unsupported("multi-document pipelines"),
    ),
    (
        "tests__test_yamls__test_multiple_accelerators_ordered.yaml",
        Plan,
    ),
    ("tests__test_yamls__test_multiple_resources.yaml", Plan),
    (
        "tests__test_yamls__test_multiple_resources_unordered.yaml",
        Plan,
    ),
];

fn corpus_dir() -> Option<(PathBuf, PathBuf)> {
    let shared = shared()?;
    let tasks = shared.join("compat/skypilot-tasks");
    let catalogs = shared.join("catalogs/skypilot-format");
    (tasks.is_dir() && catalogs.is_dir()).then_some((tasks, catalogs))
}

#[test]
fn every_corpus_file_plans_or_is_refused_clearly() {
    let Some((tasks, catalogs)) = corpus_dir() else {
        crate::skip::skipped(
            "compat",
            "../shared/compat/skypilot-tasks or ../shared/catalogs/skypilot-format not found; \
             the SkyPilot compatibility corpus was NOT checked",
        );
        return;
    };
    crate::skip::ran("compat");
    let mut on_disk: Vec<String> = std::fs::read_dir(&tasks)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = CORPUS.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "the corpus changed: update the table in tests/it/compat.rs"
    );

    let mut failures = Vec::new();
    let (mut planned, mut refused, mut no_offer) = (0, 0, 0);
    for (name, expect) in CORPUS {
        let path = tasks.join(name);
        let (code, out, err) = parts(&gangway([
            "optimize".as_ref(),
            path.as_os_str(),
            "--catalog".as_ref(),
            catalogs.as_os_str(),
            "-o".as_ref(),
            "json".as_ref(),
        ]));
        let ok = match expect {
            Plan => {
                planned += 1;
                code == 0
                    && serde_json::from_str::<serde_json::Value>(&out)
                        .ok()
                        .and_then(|v| v["plan"].as_array().map(|p| !p.is_empty()))
                        .unwrap_or(false)
            }
            Unsupported(feature) => {
                refused += 1;
                // Names the file and line: "<path>:<line>:<col>: ...".
                let located = err.contains(&format!("{}:", path.display()))
                    && err
                        .split(&format!("{}:", path.display()))
                        .nth(1)
                        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
                code == 2 && located && err.contains("not supported yet:") && err.contains(feature)
            }
            NoOffer(reason) => {
                no_offer += 1;
                code == 3 && err.contains(reason)
            }
        };
        if !ok {
            failures.push(format!("{name}: exit {code}\n{err}"));
        }
    }
    assert!(
        failures.is_empty(),
        "corpus failures:\n{}",
        failures.join("\n")
    );
    eprintln!("compat corpus: {planned} planned, {refused} refused as not supported yet, {no_offer} not offered by those catalogs");
}
