//! The Lambda binary of all four functions. Each function's `Handler` in the
//! template is its name, which Lambda hands the process as `_HANDLER`; one
//! binary means a deploy compiles and links the autoscaler once, not four
//! times (the four links were most of a cold `sam build`).

use lambda_runtime::Error;
use nodesmith::lambda::Function;

#[tokio::main]
async fn main() -> Result<(), Error> {
    match Function::from_env()? {
        Function::Provision => provision::serve().await,
        Function::Launch => launch::serve().await,
        Function::Interrupt => interrupt::serve().await,
        Function::Sweep => sweep::serve().await,
    }
}
